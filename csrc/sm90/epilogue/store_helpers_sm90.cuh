// Register-level helpers of the varlen epilogues' stores (bf16 packing is common/ptx.cuh): the
// 128-byte swizzle's chunk offsets, and the quad transpose that turns 4 lanes' column pairs into
// one lane's 16-byte chunk (TileStore::kQuadTranspose).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/bfloat16.h"

#include "common/ptx.cuh"

namespace sonicmoe::sm90 {

// Byte offset of 16-byte chunk `chunk` (< 8) of row `row` in a tile of 128-byte rows in TMA's
// 128-byte swizzle (a 64-column bf16 box): the chunk moves to chunk ^ (row % 8).
__device__ __forceinline__ uint32_t swizzle128_offset(int row, int chunk) {
  return row * 128 + ((chunk ^ (row % 8)) * 16);
}

// Transposes a 4 x 4 matrix of registers across the 4 lanes of a quad: lane l's x[i] becomes
// lane i's x[l] (two butterfly rounds, one shuffle per pair of registers and round).
__device__ __forceinline__ void quad_transpose(uint32_t (&x)[4]) {
  const int lane = threadIdx.x % 4;
  CUTLASS_PRAGMA_UNROLL
  for (int mask = 1; mask <= 2; mask *= 2) {
    const bool upper = lane & mask;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < 4; ++i) {
      if (i & mask) continue;
      // Pair (i, i + mask): keep the entry on this lane's side, trade the other one.
      const uint32_t received = __shfl_xor_sync(0xffffffffu, upper ? x[i] : x[i + mask], mask);
      if (upper) x[i] = received; else x[i + mask] = received;
    }
  }
}

// After quad_transpose of 4 column groups starting at group q0, lane l of a quad holds group
// q0 + l of its row: its first tile column is the quad's first one (this lane's column of value
// (0, v1, q0), less 2 l) plus 8 l.
template <class Coords>
__device__ __forceinline__ int quad_chunk_col(const Coords& coords, int v1, int q0, int half) {
  const int quad_lane = threadIdx.x % 4;
  return cute::get<1>(coords(cute::make_coord(cute::make_coord(0, v1, q0), half, 0))) - 2 * quad_lane +
         8 * quad_lane;
}

}  // namespace sonicmoe::sm90
