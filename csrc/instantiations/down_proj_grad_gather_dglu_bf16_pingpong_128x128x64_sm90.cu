// K4: dA' = dO[gather] @ w2[e] with dO rows gathered by cp.async and w2 (E, d, n) read N-major
// by TMA; the gated activation's backward / score-gradient epilogue reading H; ping-pong 128x128x64, no cluster, sm90a.
#include "sm90/grouped_gemm_sm90.h"
#include "sm90/varlen_gemm_launch_sm90.cuh"

namespace sonicmoe::sm90 {

Status run_down_proj_grad(const DownProjGradParams& p) {
  return run_down_proj_grad_varlen<GemmTileConfig::kVarlenPingpong128x128x64>(p);
}

}  // namespace sonicmoe::sm90
