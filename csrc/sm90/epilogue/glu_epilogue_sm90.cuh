// GluEpilogue (K1). Reads nothing but the accumulators (gate and up columns of one tile);
// computes A = act(gate) * up in fp32 (kAct: SwiGLU, GeGLU or ReGLU, common/glu_math.cuh);
// writes A (m_total, n) and, when kept for backward, H = [gate | up] (m_total, 2n) in H's column
// order, both bf16. Its b_rows pair each gate box with the matching up box, which is what lets
// the gated activation fuse here.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cute/tensor.hpp"

#include "common/glu_tile.cuh"
#include "common/h_column_order.h"
#include "sm90/epilogue/epilogue_tile_sm90.cuh"
#include "sm90/epilogue/store_helpers_sm90.cuh"
#include "sm90/epilogue/glu_chunks_sm90.cuh"
#include "sm90/ptx.cuh"
#include "common/varlen_tile_scheduler.cuh"

namespace sonicmoe::sm90 {

// K1: the tile's N columns are kTileN / 2 gate columns (w1 rows of the gate half, from
// n_block * kTileN / 2) and the matching up columns (w1 rows n + ...), so both halves of the
// gated activation meet in one thread.
// Stores H = [gate | up] (m_total, 2n; in H's column order, common/h_column_order.h) when kept
// for backward, and A = act(gate) * up (m_total, n), computed from the fp32 accumulators.
template <int kTileM, int kTileN, TileStore kStore, GluActivation kAct>
struct GluEpilogue : GluTileColumns<kTileN> {  // Params, n_blocks, b_rows
  using Tile = EpilogueTile<kTileM, kTileN>;
  using Element = typename Tile::Element;
  using Params = typename GluTileColumns<kTileN>::Params;
  static constexpr int kHalf = GluTileColumns<kTileN>::kHalf;
  static_assert(kHalf <= Tile::kWindowCols, "A fits one window");

  // accum is ((2, 2, kTileN / 8), halves, 1): value (v0, v1, j) is column 8 j + 2 (lane % 4) + v0,
  // so the up column matching gate column c (j < kTileN / 16) is value j + kTileN / 16.
  template <class Accumulator, class Coords>
  static __device__ void store(const Params& p, Element* smem, const Accumulator& accum,
                               const Coords& coords, const VarlenTile& t, int thread_idx,
                               int barrier_id) {
    static_assert(decltype(cute::size<0, 2>(accum))::value == kTileN / 8, "accumulator layout");
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
    constexpr int kGroups = kTileN / 16;  // gate column groups (8 columns each)
    static_assert(kGroups % 4 == 0, "whole quads of column groups");
    const int col0 = t.n_block * kHalf;
    const int64_t h_pitch = 2 * int64_t(p.n);
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < Tile::halves(accum); ++h) {
      CUTLASS_PRAGMA_UNROLL
      for (int v1 = 0; v1 < 2; ++v1) {
        const int r = get<0>(coords(make_coord(make_coord(0, v1, 0), h, 0)));
        const int64_t row = t.row_start + r;
        CUTLASS_PRAGMA_UNROLL
        for (int q0 = 0; q0 < kGroups; q0 += 4) {
          uint32_t gate4[4], up4[4], act4[4];
          CUTLASS_PRAGMA_UNROLL
          for (int b = 0; b < 4; ++b) {
            const float g0 = accum(make_coord(make_coord(0, v1, q0 + b), h, 0));
            const float g1 = accum(make_coord(make_coord(1, v1, q0 + b), h, 0));
            const float u0 = accum(make_coord(make_coord(0, v1, q0 + b + kGroups), h, 0));
            const float u1 = accum(make_coord(make_coord(1, v1, q0 + b + kGroups), h, 0));
            gate4[b] = pack_bf16x2(g0, g1);
            up4[b] = pack_bf16x2(u0, u1);
            act4[b] = pack_bf16x2(glu_act<kAct>(g0) * u0, glu_act<kAct>(g1) * u1);
          }
          const int col = col0 + quad_chunk_col(coords, v1, q0, h);  // gate columns
          const bool ok = r < t.rows && col < p.n;
          quad_transpose(act4);
          if (ok) store_16B(p.a + row * p.n + col, act4);
          if (p.h != nullptr) {
            reorder_h_chunks(gate4, up4, col, p.n);  // the accumulator's layout to H's stored order
            if (ok) {
              store_16B(p.h + row * h_pitch + col, gate4);
              store_16B(p.h + row * h_pitch + p.n + col, up4);
            }
          }
        }
      }
    }
  }

 private:
  template <class Accumulator, class Coords>
  static __device__ void store_staged(const Params& p, Element* smem, const Accumulator& accum,
                                      const Coords& coords, const VarlenTile& t, int thread_idx,
                                      int barrier_id) {
    using namespace cute;
    constexpr int kGroups = kTileN / 16;
    const int col0 = t.n_block * kHalf;
    const int64_t h_pitch = 2 * int64_t(p.n);
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < Tile::halves(accum); ++h) {
      const int half_row = Tile::half_row(coords, h);
      const int rows = Tile::valid_rows(t, half_row);
      if (rows == 0) break;
      const int64_t row0 = t.row_start + half_row;
      Tile::sync(barrier_id);
      if (p.h != nullptr) {
        cute::for_each(cute::make_int_sequence<Tile::kWindows>{}, [&](auto window) {
          constexpr int w = decltype(window)::value;
          // H's column order: a column moves within its 32-column block (common/h_column_order.h).
          Tile::template write_half<w>(smem, accum, coords, h, half_row, [&](int tile_col) {
            const int col = col0 + tile_col % kHalf;
            return tile_col - col + int(h_position(col, p.n));
          });
          Tile::sync(barrier_id);
          Tile::template store_rows<Tile::kWindowCols>(smem, rows, thread_idx, [&](int r, int chunk) -> Element* {
            const int tile_col = w * Tile::kWindowCols + chunk * 8;  // gate columns, then up
            const int col = col0 + tile_col % kHalf;
            return col < p.n ? p.h + (row0 + r) * h_pitch + (tile_col / kHalf) * p.n + col : nullptr;
          });
          Tile::sync(barrier_id);
        });
      }
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kGroups; ++j) {
        CUTLASS_PRAGMA_UNROLL
        for (int v1 = 0; v1 < 2; ++v1) {
          float act[2];
          CUTLASS_PRAGMA_UNROLL
          for (int v0 = 0; v0 < 2; ++v0) {
            const float gate = accum(make_coord(make_coord(v0, v1, j), h, 0));
            const float up = accum(make_coord(make_coord(v0, v1, j + kGroups), h, 0));
            act[v0] = glu_act<kAct>(gate) * up;
          }
          const auto rc = coords(make_coord(make_coord(0, v1, j), h, 0));
          const int r = get<0>(rc) - half_row;
          *reinterpret_cast<__nv_bfloat162*>(smem + r * Tile::kPitch + get<1>(rc)) =
              __floats2bfloat162_rn(act[0], act[1]);
        }
      }
      Tile::sync(barrier_id);
      Tile::template store_rows<kHalf>(smem, rows, thread_idx, [&](int r, int chunk) -> Element* {
        const int col = col0 + chunk * 8;
        return col < p.n ? p.a + (row0 + r) * p.n + col : nullptr;
      });
    }
  }
};

}  // namespace sonicmoe::sm90
