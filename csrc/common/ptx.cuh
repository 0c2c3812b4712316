// Arch-generic inline PTX of the kernels (sm90 and sm100), one wrapper per instruction: global
// 16-byte accesses, cp.async with zero fill, the async-proxy fence; and the bf16 pair packing of
// the epilogues' stores. The sm90-only wrappers (shared-memory vectors, stmatrix) are sm90/ptx.cuh.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cute/arch/util.hpp"

namespace sonicmoe {

// --- global memory ---------------------------------------------------------------------------

// One 16-byte global store (the address is 16-byte aligned). nvcc split a plain uint4 store
// through an offset by a runtime element count into four 4-byte ones.
__device__ __forceinline__ void store_16B(void* dst, const uint32_t (&v)[4]) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3])
               : "memory");
}

// One 16-byte global load of data the kernel does not write (the address is 16-byte aligned),
// or zeros when !valid. Not volatile: the compiler may schedule it like a plain load.
__device__ __forceinline__ void load_16B(uint32_t (&v)[4], const void* src, bool valid) {
  if (valid) {
    asm("ld.global.nc.v4.b32 {%0, %1, %2, %3}, [%4];\n"
        : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
        : "l"(src));
  } else {
    v[0] = v[1] = v[2] = v[3] = 0u;
  }
}

// --- cp.async --------------------------------------------------------------------------------

// Copies 16 bytes global -> shared, or writes 16 zero bytes when !valid (nothing is read then).
__device__ inline void cp_async_16_zfill(uint32_t dst, const void* gmem_src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst),
               "l"(gmem_src), "r"(src_bytes)
               : "memory");
}
__device__ inline void cp_async_16_zfill(void* smem_dst, const void* gmem_src, bool valid) {
  cp_async_16_zfill(cute::cast_smem_ptr_to_uint(smem_dst), gmem_src, valid);
}

// The same for 4 bytes (through L1: .cg takes 16-byte copies only).
__device__ inline void cp_async_4_zfill(void* smem_dst, const void* gmem_src, bool valid) {
  const int src_bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(cute::cast_smem_ptr_to_uint(smem_dst)),
               "l"(gmem_src), "r"(src_bytes)
               : "memory");
}

// Closes this thread's group of cp.async copies issued so far.
__device__ __forceinline__ void cp_async_commit_group() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits for every cp.async copy of this thread.
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// --- proxies ---------------------------------------------------------------------------------

// Orders this thread's generic-proxy writes of shared memory (cp.async, st.shared) before later
// async-proxy reads of it (WGMMA, TMA stores).
__device__ __forceinline__ void fence_proxy_async_shared_cta() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// --- registers -------------------------------------------------------------------------------

// Two floats as a bf16 pair in one register (the lower column in the low half).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

}  // namespace sonicmoe
