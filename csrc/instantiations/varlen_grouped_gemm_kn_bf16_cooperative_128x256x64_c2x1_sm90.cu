// K6 (b (E, k, n_out), N-major) on cooperative 128 x 256 tiles in 2 x 1 clusters sharing B by
// TMA multicast.
#include "sm90/grouped_gemm_sm90.h"
#include "sm90/varlen_gemm_launch_sm90.cuh"

namespace sonicmoe::sm90 {

Status run_varlen_grouped_gemm_kn_cooperative_128x256_c2x1(const GroupedGemmParams& p) {
  return run_varlen_store_gemm</*k_major_b=*/false, GemmTileConfig::kVarlenCooperative128x256x64C2x1>(p);
}

}  // namespace sonicmoe::sm90
