// What the varlen-M epilogues share: how a warpgroup's accumulators map onto the tile (halves of
// 64 rows, windows of at most 128 columns), the staging tile in shared memory with its two
// copy steps, the choice of store (TileStore) and the B rows of a contiguous n tile.
//
// Stores leave as 16-byte row chunks, predicated on the tile's valid rows: a tile may end inside
// its expert's last m block, and the rows after it belong to the next expert, so no store may
// touch them (TMA stores cannot clip there). The chunks are formed either in a per-warpgroup
// shared-memory tile (rows padded by 8 elements so the accumulator writes hit 32 distinct banks)
// or in registers by a transpose across each quad (TileStore::kQuadTranspose). Varlen K (K5 / K7:
// every expert owns a whole output) stores by TMA on the cooperative tiles
// (tma_store_epilogue_sm90.cuh).
#pragma once

#include <cuda_bf16.h>

#include <utility>

#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/bfloat16.h"

#include "common/contiguous_b_rows.cuh"
#include "common/varlen_tile_scheduler.cuh"

namespace sonicmoe::sm90 {

// How a bf16 result tile leaves registers. kStaged: through the warpgroup's shared-memory tile,
// two named barriers per window, then 16-byte row chunks. kQuadTranspose: the bf16 pairs of 4
// consecutive column groups are transposed across the quad and each lane stores one group's 8
// columns as one 16-byte chunk; no shared memory and no barrier. Which one is faster depends on
// the kernel (measured on the H200): the launchers choose.
enum class TileStore { kStaged, kQuadTranspose };

// A warpgroup's accumulators leave in halves of 64 rows (its 64-row WGMMA blocks, mode 1 of
// the accumulator) and windows of at most 128 columns (64 for a 192-column tile), so the staging
// buffer is one 64 x 128 window at most: shared memory goes to mainloop stages. A ping-pong warpgroup owns the whole tile
// (halves at rows 0 and 64); in a cooperative tile the coordinates say where its halves start.
template <int kTileM, int kTileN>
struct EpilogueTile {
  static constexpr int kHalfRows = 64;
  static constexpr int kWindowCols = kTileN < 128 ? kTileN : (kTileN % 128 == 0 ? 128 : 64);
  static constexpr int kWindows = kTileN / kWindowCols;
  static constexpr int kPitch = kWindowCols + 8;  // elements per shared-memory row
  using Element = cutlass::bfloat16_t;
  using SmemTile = Element[kHalfRows * kPitch];
  static_assert(kTileN % kWindowCols == 0, "whole windows");

  static __device__ void sync(int barrier_id) { cutlass::arch::NamedBarrier::sync(128, barrier_id); }

  // Accumulator halves of this warpgroup (mode 1 of the accumulator).
  template <class Accumulator>
  static constexpr int halves(const Accumulator&) {
    return decltype(cute::size<1>(std::declval<const Accumulator&>()))::value;
  }

  // First tile row of this warpgroup's half h.
  template <class Coords>
  static __device__ int half_row(const Coords& coords, int h) {
    return cute::get<0>(coords(0, h, 0)) / kHalfRows * kHalfRows;
  }

  // Rows of the half starting at tile row `row` that hold data of the tile's expert.
  static __device__ int valid_rows(const VarlenTile& t, int row) { return max(0, min(kHalfRows, t.rows - row)); }

  // Writes the bf16 accumulator values of half h (starting at tile row `row`) in window w
  // (tile columns [128 w, 128 w + 128)) into smem, column pairs at a time. The accumulator's
  // mode 0 is (2, 2, kTileN / 8): value i sits in column 8 (i / 4) + ..., so a window is the
  // contiguous value range [kWindowCols w / 2, kWindowCols (w + 1) / 2).
  // col_map(tile column) gives the tile column the value is stored at (H's column order).
  template <int w, class Accumulator, class Coords, class ColMap = cute::identity>
  static __device__ void write_half(Element* smem, const Accumulator& accum, const Coords& coords, int h,
                                    int row, ColMap col_map = {}) {
    static_assert(decltype(cute::size<0, 2>(accum))::value == kTileN / 8, "accumulator layout");
    CUTLASS_PRAGMA_UNROLL
    for (int i = kWindowCols * w / 2; i < kWindowCols * (w + 1) / 2; i += 2) {
      const auto rc = coords(i, h, 0);
      const int r = cute::get<0>(rc) - row;
      *reinterpret_cast<__nv_bfloat162*>(smem + r * kPitch + col_map(cute::get<1>(rc)) - kWindowCols * w) =
          __floats2bfloat162_rn(accum(i, h, 0), accum(i + 1, h, 0));
    }
  }

  // Copies smem columns [0, kCols) of the first `rows` rows to global memory; dst(row, chunk)
  // gives the destination of 8-element chunk `chunk` of half row `row`, or nullptr to skip it.
  template <int kCols, class Dst>
  static __device__ void store_rows(const Element* smem, int rows, int thread_idx, Dst dst) {
    constexpr int kChunks = kCols / 8;
    for (int i = thread_idx; i < rows * kChunks; i += 128) {
      const int r = i / kChunks;
      const int chunk = i % kChunks;
      Element* out = dst(r, chunk);
      if (out != nullptr)
        *reinterpret_cast<uint4*>(out) = *reinterpret_cast<const uint4*>(smem + r * kPitch + chunk * 8);
    }
  }
};

}  // namespace sonicmoe::sm90
