// The inline PTX of the sm90 kernels, one wrapper per instruction: global and shared-memory
// vector accesses, cp.async with zero fill, stmatrix, the async-proxy fence and MUFU.TANH.
// Everything else (TMA, barriers, WGMMA) comes from CuTe / CUTLASS.
#pragma once

#include <cstdint>

#include "cute/arch/util.hpp"

namespace sonicmoe::sm90 {

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

// --- shared memory ---------------------------------------------------------------------------

// One 16-byte shared-memory load (addr: a shared-window address, 16-byte aligned).
__device__ __forceinline__ void load_shared_16B(uint32_t (&v)[4], uint32_t addr) {
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
               : "r"(addr));
}

// One 4-byte shared-memory store (addr: a shared-window address, 4-byte aligned).
__device__ __forceinline__ void store_shared_4B(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

// stmatrix.trans of four 8 x 8 bf16 matrices (addr: a shared-window address): v[j] is this lane's
// pair (row lane / 4, columns 2 (lane % 4) + 0, 1) of matrix j, lane l gives the address of the
// 16-byte row l % 8 of matrix l / 8, and row i in memory is the matrix's column i.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, const uint32_t (&v)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v[0]),
               "r"(v[1]), "r"(v[2]), "r"(v[3])
               : "memory");
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

}  // namespace sonicmoe::sm90
