// K6 with the router's part of dx folded in: out = a @ b[e] + addend_scale[r] * addend_rows[e]
// (an epilogue visitor tree), b (E, k, n_out) read N-major; 1-SM 128x256x64 tiles, sm_100a.
#include "sm100/grouped_gemm_launch_sm100.cuh"

SONICMOE_INSTANTIATE_GROUPED_GEMM_SM100(sonicmoe::sm100::GemmConfig::k1Sm128x256x64, sonicmoe::WeightLayout::kKN,
                                        /*row_addend=*/true);
