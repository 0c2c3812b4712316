// K2 on the varlen kernel with cooperative 128 x 256 tiles (both consumer warpgroups on one
// tile, 64 rows each); otherwise the same as varlen_grouped_gemm_bf16_pingpong_128x128x64_sm90.cu.
#include "sm90/grouped_gemm_sm90.h"
#include "sm90/varlen_gemm_launch_sm90.cuh"

namespace sonicmoe::sm90 {

Status run_varlen_grouped_gemm_cooperative_128x256(const GroupedGemmParams& p) {
  return run_varlen_store_gemm</*k_major_b=*/true, GemmTileConfig::kVarlenCooperative128x256x64>(p);
}

}  // namespace sonicmoe::sm90
