// WeightGradEpilogue (K5, K7 on sm100): the fp32 accumulator of a varlen-K tile from tensor memory
// to bf16. TMEM lane r holds output row r of the tile (the gathered side), so each of the 128
// epilogue threads owns one: warp w reads lanes [32 w, 32 w + 32), 32 columns per tcgen05.ld.
//  - K5 (out (E, m_out, n_out)): a thread's row is an output row; 16-byte stores along it.
//  - K7, computed as the transposed problem (kTransposedOut: the accumulator is out[e]^T, out
//    (E, n_out, m_out) in the computed problem's names): a thread's row is an output column, so
//    each TMEM column is an output row of which the warp holds 32 consecutive elements. They are
//    stored one element per thread: one instruction writes 64 contiguous bytes (two whole 32-byte
//    sectors), and the second TMEM accumulator lets these stores run under the next tile's MMAs.
//    A transpose through shared memory would cost as many shared stores as it saves global ones,
//    in memory the 4 stages of the ring fill.
// Rows past m_out and columns past n_out are never written; every other element of every expert's
// output is (an expert without rows stores the zeros of its zero-filled k step).
#pragma once

#include <cstdint>

#include "cute/container/array.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/bfloat16.h"

#include "common/ptx.cuh"
#include "common/varlen_tile_scheduler.cuh"
#include "sm100/epilogue/tmem_rows_sm100.cuh"

namespace sonicmoe::sm100 {

template <int kTileN, bool kTransposedOut>
struct WeightGradEpilogue {
  using Element = cutlass::bfloat16_t;
  static constexpr int kThreads = kEpilogueThreads;  // tmem_rows_sm100.cuh
  static constexpr int kCols = kTmemCols;
  static constexpr int kBoxCols = 64;  // the mainloop's TMA boxes of B
  static_assert(kTileN % kCols == 0 && kTileN % kBoxCols == 0, "whole TMEM loads and B boxes");

  struct Params {
    Element* out = nullptr;  // (E, m_out, n_out), or (E, n_out, m_out) with kTransposedOut
    int m_out = 0;           // the computed problem's: rows of the accumulator (the gathered side)
    int n_out = 0;           // its columns (the dense side)
  };

  static __host__ __device__ int n_blocks(const Params& p) { return (p.n_out + kTileN - 1) / kTileN; }

  // The dense operand's columns of the tile's B boxes (past n_out: zero-filled by TMA).
  static __device__ cute::array<int, kTileN / kBoxCols> b_rows(const Params&, const VarlenTile& t) {
    cute::array<int, kTileN / kBoxCols> cols;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kTileN / kBoxCols; ++i) cols[i] = t.n_block * kTileN + i * kBoxCols;
    return cols;
  }

  // The tile in TMEM columns [tmem_acc, tmem_acc + kTileN) to out. Called by the 128 epilogue
  // threads (thread_idx = tile row = TMEM lane); returns once its TMEM loads have completed.
  static __device__ void store(const Params& p, uint32_t tmem_acc, const VarlenTile& t, int thread_idx) {
    const auto [lane_base, row_ok, row] = TmemRow(tmem_acc, t, thread_idx);  // row: e * m_out + r
    const int col0 = t.n_block * kTileN;
    CUTLASS_PRAGMA_UNROLL
    for (int c = 0; c < kTileN; c += kCols) {
      const int col = col0 + c;
      if (col >= p.n_out) break;  // the same for the whole warp (tcgen05.ld is warp-wide)
      uint32_t v[kCols];
      tmem_load_cols(lane_base + c, v);
      cutlass::arch::fence_view_async_tmem_load();
      if (!row_ok) continue;
      if constexpr (!kTransposedOut) {
        Element* dst = p.out + row * p.n_out + col;
        CUTLASS_PRAGMA_UNROLL
        for (int q = 0; q < kCols / 8; ++q) {
          uint32_t chunk[4];
          CUTLASS_PRAGMA_UNROLL
          for (int i = 0; i < 4; ++i)
            chunk[i] = pack_bf16x2(__uint_as_float(v[8 * q + 2 * i]), __uint_as_float(v[8 * q + 2 * i + 1]));
          if (col + 8 * q < p.n_out) store_16B(dst + 8 * q, chunk);
        }
      } else {
        // Element (r, col + i) of expert e's accumulator is out[e][col + i][r].
        const int64_t r = row - int64_t(t.expert) * p.m_out;
        Element* dst = p.out + (int64_t(t.expert) * p.n_out + col) * p.m_out + r;
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < kCols; ++i) {
          if (col + i < p.n_out) dst[int64_t(i) * p.m_out] = Element(__uint_as_float(v[i]));
        }
      }
    }
  }
};

}  // namespace sonicmoe::sm100
