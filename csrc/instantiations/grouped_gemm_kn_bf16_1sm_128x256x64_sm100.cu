// K6 layout: out = a @ b[e] with b (E, k, n_out) read N-major by TMA (no weight transpose); 1-SM
// 128x256x64 tiles, no cluster, sm_100a.
#include "sm100/grouped_gemm_launch_sm100.cuh"

SONICMOE_INSTANTIATE_GROUPED_GEMM_SM100(sonicmoe::sm100::GemmConfig::k1Sm128x256x64, sonicmoe::WeightLayout::kKN,
                                        /*row_addend=*/false);
