// bf16 varlen-M grouped GEMM, pingpong_128x128x64_c1x1 tiles, sm90a.
#include "sm90/grouped_gemm_launch_sm90.cuh"

SONICMOE_INSTANTIATE_GROUPED_GEMM_SM90(sonicmoe::GemmTileConfig::kPingpong128x128x64C1x1);
