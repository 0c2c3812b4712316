// K4 on cooperative 128 x 256 tiles in 2 x 1 clusters sharing w2's boxes by TMA multicast;
// otherwise as down_proj_grad_gather_dglu_bf16_cooperative_128x256x64_sm90.cu.
#include "sm90/grouped_gemm_sm90.h"
#include "sm90/varlen_gemm_launch_sm90.cuh"

namespace sonicmoe::sm90 {

Status run_down_proj_grad_cooperative_128x256_c2x1(const DownProjGradParams& p) {
  return run_down_proj_grad_varlen<GemmTileConfig::kVarlenCooperative128x256x64C2x1>(p);
}

}  // namespace sonicmoe::sm90
