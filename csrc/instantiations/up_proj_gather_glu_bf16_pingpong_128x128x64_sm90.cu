// K1: bf16 up-projection, A rows gathered from x by cp.async, w1 gate/up halves paired by
// TMA, the gated activation's epilogue storing H and A (SwiGLU, GeGLU, ReGLU); ping-pong
// 128x128x64 tiles, no cluster, sm90a.
#include "sm90/grouped_gemm_sm90.h"
#include "sm90/varlen_gemm_launch_sm90.cuh"

namespace sonicmoe::sm90 {

Status run_up_proj(const UpProjParams& p) {
  return run_up_proj_varlen<GemmTileConfig::kVarlenPingpong128x128x64>(p);
}

}  // namespace sonicmoe::sm90
