// The sm90-only inline PTX of the sm90 kernels: shared-memory vector accesses and stmatrix. The
// arch-generic wrappers (global 16-byte accesses, cp.async with zero fill, the async-proxy fence)
// are common/ptx.cuh; everything else (TMA, barriers, WGMMA) comes from CuTe / CUTLASS.
#pragma once

#include <cstdint>

#include "common/ptx.cuh"
#include "cute/arch/util.hpp"

namespace sonicmoe::sm90 {

// --- shared memory ---------------------------------------------------------------------------

// One 16-byte shared-memory load (addr: a shared-window address, 16-byte aligned).
__device__ __forceinline__ void load_shared_16B(uint32_t (&v)[4], uint32_t addr) {
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
               : "r"(addr));
}

// One 4-byte shared-memory load (addr: a shared-window address, 4-byte aligned), volatile: every
// call is its own load, never merged with an equal one (whose value would then stay in a register).
__device__ __forceinline__ uint32_t load_shared_4B_volatile(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.volatile.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
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

}  // namespace sonicmoe::sm90
