// K4 on cooperative 256-row tiles; otherwise as the ping-pong unit.
#include "sm90/grouped_gemm_sm90.h"
#include "sm90/varlen_gemm_launch_sm90.cuh"

namespace sonicmoe::sm90 {

Status run_down_proj_grad_cooperative_256x128(const DownProjGradParams& p) {
  return run_down_proj_grad_varlen<GemmTileConfig::kVarlenCooperative256x128x64>(p);
}

}  // namespace sonicmoe::sm90
