// K2 on the varlen kernel with ping-pong 128 x 192 tiles (K2 and K6 only: GemmTileConfig's comment);
// otherwise as varlen_grouped_gemm_bf16_pingpong_128x128x64_sm90.cu.
#include "sm90/grouped_gemm_sm90.h"
#include "sm90/varlen_gemm_launch_sm90.cuh"

namespace sonicmoe::sm90 {

Status run_varlen_grouped_gemm_pingpong_128x192(const GroupedGemmParams& p) {
  return run_varlen_store_gemm</*k_major_b=*/true, GemmTileConfig::kVarlenPingpong128x192x64>(p);
}

}  // namespace sonicmoe::sm90
