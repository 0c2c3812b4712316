// K5 / K7 on sm100 (sm_100a): the 128-wide gathered operand by cp.async, the 256-wide dense one by
// TMA (or, for rows past offsets[E] that may be unwritten and for no rows, by cp.async too), 1-SM
// tcgen05 MMA on 128 x 256 x 64 tiles into TMEM, bf16 stores (K7's transposed).
#include "sm100/weight_grad_launch_sm100.cuh"

template sonicmoe::Status sonicmoe::sm100::run_weight_grad<sonicmoe::sm100::WeightGradConfig::k1Sm128x256x64>(
    const sonicmoe::WeightGradParams&);
template sonicmoe::Status
sonicmoe::sm100::run_weight_grad<sonicmoe::sm100::WeightGradConfig::k1Sm128x256x64CpAsyncDense>(
    const sonicmoe::WeightGradParams&);
