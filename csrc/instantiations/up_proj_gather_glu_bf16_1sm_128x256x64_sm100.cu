// K1 on sm100 (sm_100a): x rows gathered by cp.async, w1 by TMA, 1-SM tcgen05 MMA on 128 x 256
// tiles (128 gate and 128 up columns) into TMEM, the gated activation in the epilogue; every
// activation (SwiGLU, GeGLU, ReGLU).
#include "sm100/varlen_gemm_launch_sm100.cuh"

template sonicmoe::Status sonicmoe::sm100::run_up_proj<sonicmoe::sm100::UpProjConfig::k1Sm128x256x64>(
    const sonicmoe::UpProjParams&);
