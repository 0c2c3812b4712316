// K1 on cooperative 128 x 256 tiles in 2 x 1 clusters: the two CTAs of a cluster run consecutive
// tiles and share w1's boxes by TMA multicast where both tiles need them (long K loops: d >= 4096);
// otherwise as up_proj_gather_glu_bf16_cooperative_128x256x64_sm90.cu.
#include "sm90/grouped_gemm_sm90.h"
#include "sm90/varlen_gemm_launch_sm90.cuh"

namespace sonicmoe::sm90 {

Status run_up_proj_cooperative_128x256_c2x1(const UpProjParams& p) {
  return run_up_proj_varlen<GemmTileConfig::kVarlenCooperative128x256x64C2x1>(p);
}

}  // namespace sonicmoe::sm90
