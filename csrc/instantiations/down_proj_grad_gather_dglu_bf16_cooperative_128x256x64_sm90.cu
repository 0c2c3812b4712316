// K4 on cooperative 128 x 256 tiles (a gathered dO row serves 256 columns: half the gather
// work per FLOP of the 128-column tiles; two score slots per tile); otherwise as the ping-pong unit.
#include "sm90/grouped_gemm_sm90.h"
#include "sm90/varlen_gemm_launch_sm90.cuh"

namespace sonicmoe::sm90 {

Status run_down_proj_grad_cooperative_128x256(const DownProjGradParams& p) {
  return run_down_proj_grad_varlen<GemmTileConfig::kVarlenCooperative128x256x64>(p);
}

}  // namespace sonicmoe::sm90
