// bf16 varlen-M grouped GEMM (K2), 2-SM 256x256x64 tiles over a 2x1 cluster, sm_100a.
#include "sm100/grouped_gemm_launch_sm100.cuh"

SONICMOE_INSTANTIATE_GROUPED_GEMM_SM100(sonicmoe::sm100::GemmConfig::k2Sm256x256x64C2x1,
                                        sonicmoe::WeightLayout::kNK, /*row_addend=*/false);
