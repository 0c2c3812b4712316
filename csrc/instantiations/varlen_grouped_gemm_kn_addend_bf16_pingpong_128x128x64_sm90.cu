// K6 with the router's part of dx folded in: out = a @ b[e] + addend_scale[r] * addend_rows[e]
// (RowAddendStoreEpilogue), b (E, k, n_out) read N-major; ping-pong 128 x 128.
#include "sm90/grouped_gemm_sm90.h"
#include "sm90/varlen_gemm_launch_sm90.cuh"

namespace sonicmoe::sm90 {

Status run_varlen_grouped_gemm_kn_addend(const GroupedGemmParams& p) {
  return run_varlen_store_gemm</*k_major_b=*/false, GemmTileConfig::kVarlenPingpong128x128x64, /*row_addend=*/true>(p);
}

}  // namespace sonicmoe::sm90
