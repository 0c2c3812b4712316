// K6 on ping-pong 128 x 128 tiles in 2 x 1 clusters, sharing B by TMA multicast where both
// tiles of a pair need it; otherwise as varlen_grouped_gemm_kn_bf16_pingpong_128x128x64_sm90.cu.
#include "sm90/grouped_gemm_sm90.h"
#include "sm90/varlen_gemm_launch_sm90.cuh"

namespace sonicmoe::sm90 {

Status run_varlen_grouped_gemm_kn_pingpong_128x128_c2x1(const GroupedGemmParams& p) {
  return run_varlen_store_gemm</*k_major_b=*/false, GemmTileConfig::kVarlenPingpong128x128x64C2x1>(p);
}

}  // namespace sonicmoe::sm90
