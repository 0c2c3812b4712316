// StoreEpilogue (K2, K6; K5 / K7 on ping-pong tiles). Reads nothing but the accumulators;
// computes their bf16 rounding; writes out (m_total, n_out) row-major, the tile's valid rows
// only, staged through shared memory or quad-transposed (TileStore).
#pragma once

#include <cstdint>

#include "cute/tensor.hpp"

#include "sm90/epilogue/epilogue_tile_sm90.cuh"
#include "sm90/epilogue/store_helpers_sm90.cuh"
#include "sm90/ptx.cuh"
#include "common/varlen_tile_scheduler.cuh"

namespace sonicmoe::sm90 {

// K2 / K6, and K5 / K7 on ping-pong tiles: out = the accumulators as bf16, (m_total, n_out) row-major.
template <int kTileM, int kTileN, TileStore kStore>
struct StoreEpilogue {
  using Tile = EpilogueTile<kTileM, kTileN>;
  using Element = typename Tile::Element;
  static constexpr int kBoxRowsB = 64;

  struct Params {
    Element* out = nullptr;
    int n_out = 0;
  };

  static __host__ __device__ int n_blocks(const Params& p) { return (p.n_out + kTileN - 1) / kTileN; }
  static __device__ cute::array<int, kTileN / kBoxRowsB> b_rows(const Params&, const VarlenTile& t) {
    return contiguous_b_rows<kTileN, kBoxRowsB>(t);
  }

  template <class Accumulator, class Coords>
  static __device__ void store(const Params& p, Element* smem, const Accumulator& accum,
                               const Coords& coords, const VarlenTile& t, int thread_idx,
                               int barrier_id) {
    if constexpr (kStore == TileStore::kQuadTranspose)
      store_quad_transposed(p, accum, coords, t, [](int, int, int, float&, float&) {});
    else
      store_staged(p, smem, accum, coords, t, thread_idx, barrier_id);
  }

  // adjust(h, v1, g, lo, hi): a last change to the two fp32 values of column group g that this
  // lane rounds into one bf16 pair (RowAddendStoreEpilogue adds the addend there).
  template <class Accumulator, class Coords, class Adjust>
  static __device__ void store_quad_transposed(const Params& p, const Accumulator& accum, const Coords& coords,
                                               const VarlenTile& t, Adjust adjust) {
    using namespace cute;
    const int col0 = t.n_block * kTileN;
    constexpr int kGroups = decltype(size<0, 2>(accum))::value;  // 8-column groups
    static_assert(kGroups == kTileN / 8 && kGroups % 4 == 0, "accumulator layout");
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < Tile::halves(accum); ++h) {
      CUTLASS_PRAGMA_UNROLL
      for (int v1 = 0; v1 < 2; ++v1) {
        const int r = get<0>(coords(make_coord(make_coord(0, v1, 0), h, 0)));
        Element* out_row = p.out + (t.row_start + r) * int64_t(p.n_out);
        CUTLASS_PRAGMA_UNROLL
        for (int q0 = 0; q0 < kGroups; q0 += 4) {
          uint32_t out4[4];
          CUTLASS_PRAGMA_UNROLL
          for (int b = 0; b < 4; ++b) {
            float lo = accum(make_coord(make_coord(0, v1, q0 + b), h, 0));
            float hi = accum(make_coord(make_coord(1, v1, q0 + b), h, 0));
            adjust(h, v1, q0 + b, lo, hi);
            out4[b] = pack_bf16x2(lo, hi);
          }
          quad_transpose(out4);
          const int col = col0 + quad_chunk_col(coords, v1, q0, h);
          if (r < t.rows && col < p.n_out) store_16B(out_row + col, out4);
        }
      }
    }
  }

 private:
  template <class Accumulator, class Coords>
  static __device__ void store_staged(const Params& p, Element* smem, const Accumulator& accum,
                                      const Coords& coords, const VarlenTile& t, int thread_idx,
                                      int barrier_id) {
    const int col0 = t.n_block * kTileN;
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < Tile::halves(accum); ++h) {
      const int half_row = Tile::half_row(coords, h);
      const int rows = Tile::valid_rows(t, half_row);
      if (rows == 0) break;
      const int64_t row0 = t.row_start + half_row;
      cute::for_each(cute::make_int_sequence<Tile::kWindows>{}, [&](auto window) {
        constexpr int w = decltype(window)::value;
        Tile::sync(barrier_id);  // the previous stores have read smem
        Tile::template write_half<w>(smem, accum, coords, h, half_row);
        Tile::sync(barrier_id);
        Tile::template store_rows<Tile::kWindowCols>(smem, rows, thread_idx, [&](int r, int chunk) -> Element* {
          const int col = col0 + w * Tile::kWindowCols + chunk * 8;
          return col < p.n_out ? p.out + (row0 + r) * p.n_out + col : nullptr;
        });
      });
    }
  }
};

}  // namespace sonicmoe::sm90
