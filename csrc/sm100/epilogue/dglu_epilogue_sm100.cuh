// DGluEpilogue (K4 on sm100): the gated activation's backward and the score gradient from the fp32
// accumulator dA' = dO[gather] @ w2[e] in tensor memory. The tile is kTileN contiguous columns of n.
// With the sorted rows as M, TMEM lane r holds tile row r: each of the 128 epilogue threads owns
// one row, and a row's gate and up columns of H are in the same thread (no shuffle). Per 32
// columns: one tcgen05.ld of dA', 16-byte loads of H's gate and up chunks (H's column order,
// common/h_column_order.h; a trailing partial block in column order), then the math of
// common/glu_math.cuh, as sm90's K4 does it:
//   A = act(gate) * up, dA = s * dA',
//   dH = [dA * up * act'(gate), dA * act(gate)], A' = s * A, dS partial = sum_c dA' * A,
// and 16-byte stores of dH (m_total, 2n) and A' (m_total, n) in column order, bf16, and of the
// row's dS partial per 128 columns of n (d_score_partial (m_total, ceil(n / 128)) fp32): exactly
// the sm90 K4's layouts. Rows past the tile's rows and columns past n are not written; H past n
// loads as 0, so the dS terms there are 0.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cutlass/arch/barrier.h"
#include "cutlass/bfloat16.h"

#include "common/dglu_tile.cuh"
#include "common/glu_math.cuh"
#include "common/h_column_order.h"
#include "common/ptx.cuh"
#include "common/varlen_tile_scheduler.cuh"
#include "sm100/epilogue/tmem_rows_sm100.cuh"

namespace sonicmoe::sm100 {

template <int kTileN, GluActivation kAct>
struct DGluEpilogue : DGluTileColumns<kTileN> {  // n_blocks, b_rows, kSlotCols
  using Element = cutlass::bfloat16_t;
  using Params = DGluParams;
  using DGluTileColumns<kTileN>::kSlotCols;
  static constexpr int kThreads = kEpilogueThreads;  // tmem_rows_sm100.cuh
  static constexpr int kCols = kTmemCols;
  static_assert(kTileN % kCols == 0 && kSlotCols % kCols == 0, "whole TMEM loads per score slot");
  static_assert(kCols == kHBlockCols, "one load per block of H's column order");

  // The tile in TMEM columns [tmem_acc, tmem_acc + kTileN) to dH, A' and the dS partials. Called
  // by the 128 epilogue threads (thread_idx = tile row = TMEM lane); returns once its TMEM loads
  // have completed.
  static __device__ void store(const Params& p, uint32_t tmem_acc, const VarlenTile& t, int thread_idx) {
    const auto [lane_base, row_ok, row] = TmemRow(tmem_acc, t, thread_idx);
    const int col0 = t.n_block * kTileN;
    const int64_t h_pitch = 2 * int64_t(p.n);
    const int slots = (p.n + kSlotCols - 1) / kSlotCols;
    const float score = row_ok ? p.row_score[row] : 0.f;
    const Element* h_row = p.h + row * h_pitch;
    float d_score = 0.f;
    CUTLASS_PRAGMA_UNROLL
    for (int c = 0; c < kTileN; c += kCols) {
      const int col = col0 + c;
      if (col >= p.n) break;  // the same for the whole warp (tcgen05.ld is warp-wide)
      // H's 4 gate and 4 up chunks of the block, issued before the wait on the TMEM load.
      uint32_t g[kCols / 2], u[kCols / 2];
      CUTLASS_PRAGMA_UNROLL
      for (int q = 0; q < kCols / 8; ++q) {
        const bool ok = row_ok && col + 8 * q < p.n;
        load_16B(reinterpret_cast<uint32_t(&)[4]>(g[4 * q]), h_row + col + 8 * q, ok);
        load_16B(reinterpret_cast<uint32_t(&)[4]>(u[4 * q]), h_row + p.n + col + 8 * q, ok);
      }
      uint32_t acc[kCols];
      tmem_load_cols(lane_base + c, acc);
      cutlass::arch::fence_view_async_tmem_load();
      uint32_t dg[kCols / 2], du[kCols / 2], as[kCols / 2];  // column pairs, column order
      if (col + kHBlockCols <= p.n) {
        dglu_block<true>(acc, g, u, score, dg, du, as, d_score);
      } else {
        dglu_block<false>(acc, g, u, score, dg, du, as, d_score);
      }
      if (row_ok) {
        Element* d_h_row = p.d_h + row * h_pitch;
        Element* a_row = p.a_scaled + row * p.n;
        CUTLASS_PRAGMA_UNROLL
        for (int q = 0; q < kCols / 8; ++q) {
          if (col + 8 * q < p.n) {
            store_16B(d_h_row + col + 8 * q, reinterpret_cast<const uint32_t(&)[4]>(dg[4 * q]));
            store_16B(d_h_row + p.n + col + 8 * q, reinterpret_cast<const uint32_t(&)[4]>(du[4 * q]));
            store_16B(a_row + col + 8 * q, reinterpret_cast<const uint32_t(&)[4]>(as[4 * q]));
          }
        }
      }
      // The row's dS over a slot: at its last column block, or at the last block below n.
      if ((c + kCols) % kSlotCols == 0 || col + kCols >= p.n) {
        const int slot = t.n_block * (kTileN / kSlotCols) + c / kSlotCols;
        if (row_ok && slot < slots) p.d_score_partial[row * slots + slot] = d_score;
        d_score = 0.f;
      }
    }
  }

 private:
  // One block of 32 columns: acc holds dA' in column order, g / u H's gate and up as bf16 pairs in
  // H's column order (kPermuted: column j at position h_position(j), pairs (j, j + 1) adjacent for
  // even j) or in column order. Writes dH's gate and up pairs and A' in column order, adds the
  // row's dS terms (in column order) to d_score.
  template <bool kPermuted>
  static __device__ __forceinline__ void dglu_block(const uint32_t (&acc)[kCols], const uint32_t (&g)[kCols / 2],
                                                    const uint32_t (&u)[kCols / 2], float score,
                                                    uint32_t (&dg)[kCols / 2], uint32_t (&du)[kCols / 2],
                                                    uint32_t (&as)[kCols / 2], float& d_score) {
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kCols / 2; ++i) {
      const int w = kPermuted ? int(h_position(2 * i, kHBlockCols)) / 2 : i;  // H's pair of columns 2i, 2i + 1
      const float2 gate2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&g[w]));
      const float2 up2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u[w]));
      float d_gate[2], d_up[2], a_s[2];
      CUTLASS_PRAGMA_UNROLL
      for (int v = 0; v < 2; ++v) {
        const float gate = v ? gate2.y : gate2.x, up = v ? up2.y : up2.x;
        dglu_column<kAct>(gate, up, __uint_as_float(acc[2 * i + v]), score, d_gate[v], d_up[v], a_s[v], d_score);
      }
      dg[i] = pack_bf16x2(d_gate[0], d_gate[1]);
      du[i] = pack_bf16x2(d_up[0], d_up[1]);
      as[i] = pack_bf16x2(a_s[0], a_s[1]);
    }
  }
};

}  // namespace sonicmoe::sm100
