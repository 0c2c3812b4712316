// DGluEpilogue (K4 on ping-pong and 256 x 128 tiles). Reads dA' (the accumulators), H
// (m_total, 2n) bf16 by 16-byte global loads and row_score (m_total) fp32; computes the gated
// activation's backward and the score gradient (dglu_columns_sm90.cuh); writes d_h (m_total, 2n), a_scaled (m_total, n)
// bf16 and d_score_partial (m_total, ceil(n / 128)) fp32.
#pragma once

#include <cstdint>

#include "cute/tensor.hpp"

#include "sm90/epilogue/dglu_columns_sm90.cuh"
#include "sm90/epilogue/epilogue_tile_sm90.cuh"
#include "sm90/epilogue/store_helpers_sm90.cuh"
#include "sm90/epilogue/glu_chunks_sm90.cuh"
#include "sm90/ptx.cuh"
#include "common/varlen_tile_scheduler.cuh"

namespace sonicmoe::sm90 {

template <int kTileM, int kTileN, GluActivation kAct>
struct DGluEpilogue : DGluColumns<kTileN> {
  using Tile = EpilogueTile<kTileM, kTileN>;
  using Element = typename Tile::Element;
  using Columns = DGluColumns<kTileN>;
  using Columns::kSlotCols;

  using Params = DGluParams;  // common/dglu_tile.cuh

  template <class Accumulator, class Coords>
  static __device__ void store(const Params& p, Element*, const Accumulator& accum, const Coords& coords,
                               const VarlenTile& t, int, int) {
    using namespace cute;
    const int col0 = t.n_block * kTileN;
    const int64_t h_pitch = 2 * int64_t(p.n);
    const int slots = (p.n + kSlotCols - 1) / kSlotCols;
    CUTLASS_PRAGMA_UNROLL
    for (int m = 0; m < size<1>(accum); ++m) {
      CUTLASS_PRAGMA_UNROLL
      for (int v1 = 0; v1 < 2; ++v1) {
        const int r = get<0>(coords(make_coord(make_coord(0, v1, 0), m, 0)));
        const bool row_ok = r < t.rows;
        const int64_t row = t.row_start + r;
        const float score = row_ok ? p.row_score[row] : 0.f;
        float d_score = 0.f;
        // H loads in groups of kBatch column pairs ahead of their math and stores: with the
        // stores in between, the compiler may not move a later load above them (d_h and h
        // could alias), and every column pair waited a full global-memory round trip. Whole
        // rows at once (16 pairs) spill at the kernel's 168-register budget.
        constexpr int kPairs = decltype(size<0, 2>(accum))::value;
        constexpr int kBatch = 8;
        constexpr int kSlotGroups = kSlotCols / 8;  // 8-column groups per score slot
        static_assert(kPairs % kBatch == 0 && kSlotGroups % kBatch == 0, "batches within one slot");
        CUTLASS_PRAGMA_UNROLL
        for (int j0 = 0; j0 < kPairs; j0 += kBatch) {
          // H as 16-byte chunks: lane l of a quad loads chunk l of each 32-column block, its own
          // 2 columns of each of the 4 groups in H's column order (a partial block, in column
          // order, is transposed to that).
          uint32_t g4[kBatch / 4][4], u4[kBatch / 4][4];
          CUTLASS_PRAGMA_UNROLL
          for (int q = 0; q < kBatch / 4; ++q) {
            const int col = col0 + quad_chunk_col(coords, v1, j0 + 4 * q, m);
            const bool ok = row_ok && col < p.n;
            load_16B(g4[q], p.h + row * h_pitch + col, ok);
            load_16B(u4[q], p.h + row * h_pitch + p.n + col, ok);
          }
          CUTLASS_PRAGMA_UNROLL
          for (int q = 0; q < kBatch / 4; ++q) {
            reorder_h_chunks(g4[q], u4[q], col0 + quad_chunk_col(coords, v1, j0 + 4 * q, m), p.n);
          }
          // Results of 4 column groups at a time, transposed across the quad so each lane
          // stores one group's 8 columns as a 16-byte chunk (a warp store: 8 rows x 64 bytes,
          // where bf16-pair stores wrote 8 rows x 16 bytes per instruction).
          CUTLASS_PRAGMA_UNROLL
          for (int q0 = 0; q0 < kBatch; q0 += 4) {
            // Columns past n and rows past the tile load H as 0: every result is 0 there, and
            // the stores below skip them.
            uint32_t dg4[4], du4[4], as4[4];
            dglu_groups<kAct>(accum, v1, m, j0 + q0, score, g4[q0 / 4], u4[q0 / 4], dg4, du4, as4, d_score);
            quad_transpose(dg4);
            quad_transpose(du4);
            quad_transpose(as4);
            const int col = col0 + quad_chunk_col(coords, v1, j0 + q0, m);
            if (row_ok && col < p.n) {
              Element* d_h_row = p.d_h + row * h_pitch;
              store_16B(d_h_row + col, dg4);
              store_16B(d_h_row + p.n + col, du4);
              store_16B(p.a_scaled + row * p.n + col, as4);
            }
          }
          if ((j0 + kBatch) % kSlotGroups == 0) {
            Columns::store_slot(p, d_score, row_ok, row, t.n_block, j0 / kSlotGroups, slots);
            d_score = 0.f;
          }
        }
      }
    }
  }
};

}  // namespace sonicmoe::sm90
