// K6 with the router's part of dx folded in: out = a @ b[e] + addend_scale[r] * addend_rows[e]
// (RowAddendStoreEpilogue), b (E, k, n_out) read N-major; cooperative 128 x 256 tiles in 2 x 1 clusters.
#include "sm90/grouped_gemm_sm90.h"
#include "sm90/varlen_gemm_launch_sm90.cuh"

namespace sonicmoe::sm90 {

Status run_varlen_grouped_gemm_kn_addend_cooperative_128x256_c2x1(const GroupedGemmParams& p) {
  return run_varlen_store_gemm</*k_major_b=*/false, GemmTileConfig::kVarlenCooperative128x256x64C2x1, /*row_addend=*/true>(p);
}

}  // namespace sonicmoe::sm90
