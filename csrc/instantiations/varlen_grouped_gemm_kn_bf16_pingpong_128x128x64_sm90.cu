// K6 layout on the varlen kernel: out = a @ b[e] with b (E, k, n_out) read N-major by TMA (no
// weight transpose); contiguous A by TMA, masked row stores; ping-pong 128x128x64, sm90a.
#include "sm90/grouped_gemm_sm90.h"
#include "sm90/varlen_gemm_launch_sm90.cuh"

namespace sonicmoe::sm90 {

Status run_varlen_grouped_gemm_kn(const GroupedGemmParams& p) {
  return run_varlen_store_gemm</*k_major_b=*/false>(p);
}

}  // namespace sonicmoe::sm90
