// H's chunks, shared by K1's epilogue (GluEpilogue) and K4's (DGluEpilogue,
// DGluSmemSourceEpilogue): the reorder of H's 16-byte chunks between its stored column order
// (common/h_column_order.h) and the accumulator's layout. The activations' math is
// common/glu_math.cuh.
#pragma once

#include <cstdint>

#include "common/glu_math.cuh"
#include "common/h_column_order.h"
#include "sm90/epilogue/store_helpers_sm90.cuh"
#include "sm90/ptx.cuh"

namespace sonicmoe::sm90 {

// Whether the 32-column block of H holding this lane's chunk at half column `col` (from
// quad_chunk_col) is whole, and so in fragment order (common/h_column_order.h): there the lane's
// own four column pairs are its chunk, and no quad transpose is needed. The same for the whole
// warp (its lanes share the columns).
__device__ __forceinline__ bool h_block_in_fragment_order(int col, int n) {
  return col - 8 * int(threadIdx.x % 4) + kHBlockCols <= n;
}

// This lane's gate and up chunks of H at half column `col`, between H's stored order and the
// accumulator's layout (either way: the quad transpose is its own inverse): nothing to do in a
// whole 32-column block, a transpose in a trailing partial one (stored in column order).
__device__ __forceinline__ void reorder_h_chunks(uint32_t (&gate4)[4], uint32_t (&up4)[4], int col, int n) {
  if (h_block_in_fragment_order(col, n)) return;
  quad_transpose(gate4);
  quad_transpose(up4);
}

}  // namespace sonicmoe::sm90
