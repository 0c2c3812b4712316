// K4 on sm100 (sm_100a): dO rows gathered by cp.async, w2 (E, d, n) by TMA read N-major, 1-SM
// tcgen05 MMA on 128 x 256 tiles (256 columns of n) into TMEM, the gated activation's backward and
// the score gradient in the epilogue; every activation (SwiGLU, GeGLU, ReGLU).
#include "sm100/varlen_gemm_launch_sm100.cuh"

template sonicmoe::Status sonicmoe::sm100::run_down_proj_grad<sonicmoe::sm100::DownProjGradConfig::k1Sm128x256x64>(
    const sonicmoe::DownProjGradParams&);
