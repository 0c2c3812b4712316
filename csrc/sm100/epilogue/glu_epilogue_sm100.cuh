// GluEpilogue (K1 on sm100): the gated activation from the fp32 accumulator in tensor memory.
// The tile's kTileN columns are kTileN / 2 gate columns (w1 rows from n_block * kTileN / 2) and
// the matching up columns (w1 rows n + ...), as on sm90. With tokens as M, TMEM lane r holds tile
// row r: each of the 128 epilogue threads owns one row, so a gate column and its up column are in
// the same thread and no shuffle is needed. Per 32 columns: two tcgen05.ld (gate, up), then
// A = act(gate) * up in fp32 (common/glu_math.cuh, shared with sm90), and 16-byte stores of A and,
// when kept, of H = [gate | up] in H's column order (common/h_column_order.h), both bf16, exactly
// as the sm90 K1 writes them. Rows past the tile's rows and columns past n are not written.
#pragma once

#include <cstdint>

#include "cute/container/array.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/bfloat16.h"

#include "common/glu_math.cuh"
#include "common/glu_tile.cuh"
#include "common/h_column_order.h"
#include "common/ptx.cuh"
#include "common/varlen_tile_scheduler.cuh"
#include "sm100/epilogue/tmem_rows_sm100.cuh"

namespace sonicmoe::sm100 {

template <int kTileN, GluActivation kAct>
struct GluEpilogue : GluTileColumns<kTileN> {  // Params, n_blocks, b_rows
  using Element = cutlass::bfloat16_t;
  using Params = typename GluTileColumns<kTileN>::Params;
  static constexpr int kHalf = GluTileColumns<kTileN>::kHalf;
  static constexpr int kThreads = kEpilogueThreads;  // tmem_rows_sm100.cuh
  static constexpr int kCols = kTmemCols;
  static_assert(kHalf % kCols == 0, "whole TMEM loads");
  static_assert(kCols == kHBlockCols, "one load per block of H's column order");

  // The tile in TMEM columns [tmem_acc, tmem_acc + kTileN) to A and H. Called by the 128 epilogue
  // threads (thread_idx = tile row = TMEM lane); returns once its TMEM loads have completed.
  static __device__ void store(const Params& p, uint32_t tmem_acc, const VarlenTile& t, int thread_idx) {
    const auto [lane_base, row_ok, row] = TmemRow(tmem_acc, t, thread_idx);
    const int col0 = t.n_block * kHalf;
    CUTLASS_PRAGMA_UNROLL
    for (int c = 0; c < kHalf; c += kCols) {
      const int col = col0 + c;
      if (col >= p.n) break;  // the same for the whole warp (tcgen05.ld is warp-wide)
      uint32_t gate[kCols], up[kCols];
      tmem_load_cols(lane_base + c, gate);
      tmem_load_cols(lane_base + kHalf + c, up);
      cutlass::arch::fence_view_async_tmem_load();
      if (!row_ok) continue;
      uint32_t act[kCols / 2];
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kCols / 2; ++i) {
        const float g0 = __uint_as_float(gate[2 * i]), g1 = __uint_as_float(gate[2 * i + 1]);
        act[i] = pack_bf16x2(glu_act<kAct>(g0) * __uint_as_float(up[2 * i]),
                             glu_act<kAct>(g1) * __uint_as_float(up[2 * i + 1]));
      }
      Element* a_row = p.a + row * p.n + col;
      CUTLASS_PRAGMA_UNROLL
      for (int q = 0; q < kCols / 8; ++q) {
        if (col + 8 * q < p.n) store_16B(a_row + 8 * q, {act[4 * q], act[4 * q + 1], act[4 * q + 2], act[4 * q + 3]});
      }
      if (p.h == nullptr) continue;
      Element* h_row = p.h + row * (2 * int64_t(p.n)) + col;
      if (col + kHBlockCols <= p.n) {  // a whole block: stored in H's column order
        store_h_block<true>(h_row, gate, kCols);
        store_h_block<true>(h_row + p.n, up, kCols);
      } else {  // a trailing partial block: column order, its chunks below n
        store_h_block<false>(h_row, gate, p.n - col);
        store_h_block<false>(h_row + p.n, up, p.n - col);
      }
    }
  }

 private:
  // One block of 32 fp32 columns (v) to bf16 at dst, 16-byte chunks below `cols`: position j holds
  // column h_position(j) of the block in H's order (kPermuted), else column j.
  template <bool kPermuted>
  static __device__ void store_h_block(Element* dst, const uint32_t (&v)[kCols], int cols) {
    CUTLASS_PRAGMA_UNROLL
    for (int q = 0; q < kCols / 8; ++q) {
      uint32_t chunk[4];
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < 4; ++i) {
        const int j = 8 * q + 2 * i;
        const int c0 = kPermuted ? int(h_position(j, kHBlockCols)) : j;
        const int c1 = kPermuted ? int(h_position(j + 1, kHBlockCols)) : j + 1;
        chunk[i] = pack_bf16x2(__uint_as_float(v[c0]), __uint_as_float(v[c1]));
      }
      if (8 * q < cols) store_16B(dst + 8 * q, chunk);
    }
  }
};

}  // namespace sonicmoe::sm100
