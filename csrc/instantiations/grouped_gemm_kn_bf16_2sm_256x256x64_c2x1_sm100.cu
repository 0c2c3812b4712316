// K6 layout: out = a @ b[e] with b (E, k, n_out) read N-major by TMA (no weight transpose); 2-SM
// 256x256x64 tiles over a 2x1 cluster, sm_100a.
#include "sm100/grouped_gemm_launch_sm100.cuh"

SONICMOE_INSTANTIATE_GROUPED_GEMM_SM100(sonicmoe::sm100::GemmConfig::k2Sm256x256x64C2x1,
                                        sonicmoe::WeightLayout::kKN, /*row_addend=*/false);
