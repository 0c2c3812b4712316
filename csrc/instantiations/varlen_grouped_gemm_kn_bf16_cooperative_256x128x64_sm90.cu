// K6 (b (E, k, n_out), N-major) on cooperative 256-row tiles.
#include "sm90/grouped_gemm_sm90.h"
#include "sm90/varlen_gemm_launch_sm90.cuh"

namespace sonicmoe::sm90 {

Status run_varlen_grouped_gemm_kn_cooperative_256x128(const GroupedGemmParams& p) {
  return run_varlen_store_gemm</*k_major_b=*/false, GemmTileConfig::kVarlenCooperative256x128x64>(p);
}

}  // namespace sonicmoe::sm90
