// K5 / K7 on the cooperative varlen-K tile, one CTA per tile (run_weight_grad_cooperative_with);
// sm90a.
#include "sm90/grouped_gemm_sm90.h"
#include "sm90/weight_grad_launch_sm90.cuh"

namespace sonicmoe::sm90 {

Status run_weight_grad_cooperative(const WeightGradParams& p) { return run_weight_grad_cooperative_with<1>(p); }

}  // namespace sonicmoe::sm90
