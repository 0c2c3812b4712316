// K6 with the router's part of dx folded in: out = a @ b[e] + addend_scale[r] * addend_rows[e]
// (an epilogue visitor tree), b (E, k, n_out) read N-major; 2-SM 256x256x64 tiles over a 2x1
// cluster, sm_100a.
#include "sm100/grouped_gemm_launch_sm100.cuh"

SONICMOE_INSTANTIATE_GROUPED_GEMM_SM100(sonicmoe::sm100::GemmConfig::k2Sm256x256x64C2x1,
                                        sonicmoe::WeightLayout::kKN, /*row_addend=*/true);
