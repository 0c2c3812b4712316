// K5 / K7 on the cooperative varlen-K tile in 2 x 1 clusters: the two m blocks of a pair share the
// TMA side by multicast (run_weight_grad_cooperative_with); sm90a.
#include "sm90/grouped_gemm_sm90.h"
#include "sm90/weight_grad_launch_sm90.cuh"

namespace sonicmoe::sm90 {

Status run_weight_grad_cooperative_c2x1(const WeightGradParams& p) { return run_weight_grad_cooperative_with<2>(p); }

}  // namespace sonicmoe::sm90
