// Included by every sm100 launch header. tcgen05 needs CUDA 12.8+, and the sm100 kernels run only
// where they were compiled for the exact arch: neither CUTLASS's sm100 kernels nor ours have an
// arch guard of their own, so a device pass for any other arch (sm_90a, a family target) would
// compile tcgen05 code that cannot run, or fail deep in CuTe.
#pragma once

#include "cutlass/arch/config.h"

#if !defined(CUTLASS_ARCH_MMA_SM100_SUPPORTED)
#error "the sm100 kernels need CUDA 12.8 or later (tcgen05)"
#endif
#if defined(__CUDA_ARCH__) && !defined(CUTLASS_ARCH_MMA_SM100A_ENABLED)
#error "*_sm100.cu units compile for -gencode=arch=compute_100a,code=sm_100a only (CMakeLists.txt)"
#endif
