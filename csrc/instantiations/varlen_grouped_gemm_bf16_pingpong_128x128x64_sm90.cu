// K2 on the varlen kernel: bf16 grouped GEMM, contiguous A by TMA, K-major weights, masked row
// stores, ping-pong 128x128x64 tiles, no cluster, sm90a.
#include "sm90/grouped_gemm_sm90.h"
#include "sm90/varlen_gemm_launch_sm90.cuh"

namespace sonicmoe::sm90 {

Status run_varlen_grouped_gemm(const GroupedGemmParams& p) {
  return run_varlen_store_gemm</*k_major_b=*/true>(p);
}

}  // namespace sonicmoe::sm90
