// K1 on cooperative 256-row tiles: both consumer warpgroups work on one tile, 128 rows each;
// otherwise the same as up_proj_gather_glu_bf16_pingpong_128x128x64_sm90.cu.
#include "sm90/grouped_gemm_sm90.h"
#include "sm90/varlen_gemm_launch_sm90.cuh"

namespace sonicmoe::sm90 {

Status run_up_proj_cooperative_256x128(const UpProjParams& p) {
  return run_up_proj_varlen<GemmTileConfig::kVarlenCooperative256x128x64>(p);
}

}  // namespace sonicmoe::sm90
