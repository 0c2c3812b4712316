// The B rows of an epilogue whose n tile is kTileN contiguous columns (sm90's store epilogues,
// K4's on every arch).
#pragma once

#include "cute/container/array.hpp"
#include "cutlass/cutlass.h"

#include "common/varlen_tile_scheduler.cuh"

namespace sonicmoe {

// The B rows (w's output columns) of an n tile of kTileN contiguous columns, in boxes of
// kBoxRows: what b_rows returns for every epilogue but the gated ones (whose tile is two halves).
template <int kTileN, int kBoxRows>
__device__ __forceinline__ cute::array<int, kTileN / kBoxRows> contiguous_b_rows(const VarlenTile& t) {
  cute::array<int, kTileN / kBoxRows> rows;
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < kTileN / kBoxRows; ++i) rows[i] = t.n_block * kTileN + i * kBoxRows;
  return rows;
}

}  // namespace sonicmoe
