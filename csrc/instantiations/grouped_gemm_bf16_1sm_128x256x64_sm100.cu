// bf16 varlen-M grouped GEMM (K2), 1-SM 128x256x64 tiles, no cluster, sm_100a.
#include "sm100/grouped_gemm_launch_sm100.cuh"

SONICMOE_INSTANTIATE_GROUPED_GEMM_SM100(sonicmoe::sm100::GemmConfig::k1Sm128x256x64, sonicmoe::WeightLayout::kNK,
                                        /*row_addend=*/false);
