// K1 on cooperative 128 x 256 tiles: both consumer warpgroups work on one tile, 64 rows each, so
// a gathered x row serves 128 gate and 128 up columns (half the gather work per FLOP of a
// 128 x 128 tile); otherwise the same as up_proj_gather_glu_bf16_pingpong_128x128x64_sm90.cu.
#include "sm90/grouped_gemm_sm90.h"
#include "sm90/varlen_gemm_launch_sm90.cuh"

namespace sonicmoe::sm90 {

Status run_up_proj_cooperative_128x256(const UpProjParams& p) {
  return run_up_proj_varlen<GemmTileConfig::kVarlenCooperative128x256x64>(p);
}

}  // namespace sonicmoe::sm90
