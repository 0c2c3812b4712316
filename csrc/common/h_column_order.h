// H's column order, shared by K1 (which writes H), K4 (which reads it) and the tests.
#pragma once

#include <cstdint>

namespace sonicmoe {

// H's column order. K1 writes H and only K4 reads it, so it is kept in the accumulators' own
// order: in each whole 32-column block of the gate half and of the up half, 16-byte chunk l holds
// the block's columns 8 b + 2 l + v (b = 0..3, v = 0, 1) at position 2 b + v, which are one
// lane's four column pairs of the WGMMA accumulator. K1 stores them and K4 loads them with no
// shuffle across the quad. A trailing block of fewer than 32 columns (n % 32 != 0) stays in
// column order. h_position(col, n) is where column col (< n) of a half sits in it; the map is its
// own inverse (sonicmoe.h_column_order in Python).
constexpr int kHBlockCols = 32;
constexpr int64_t h_position(int64_t col, int64_t n) {
  const int64_t block = col / kHBlockCols * kHBlockCols, j = col % kHBlockCols;
  return block + kHBlockCols > n ? col : block + (j / 2 % 4) * 8 + (j / 8) * 2 + j % 2;
}

}  // namespace sonicmoe
