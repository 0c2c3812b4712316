// Epilogues of the sm90 varlen-M grouped GEMMs. Each one also says which weight rows form a
// tile's N columns (the B box origins the mainloop loads), since that pairing is what makes
// the SwiGLU fusion possible.
//
// Stores go through a per-warpgroup shared-memory tile (rows padded by 8 elements so the
// accumulator writes hit 32 distinct banks) and leave as 16-byte row chunks, predicated on
// the tile's valid rows: a tile may end inside its expert's last m block, and the rows after
// it belong to the next expert, so no store may touch them (TMA stores cannot clip there).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/bfloat16.h"

#include "sm90/varlen_tile_scheduler.cuh"

namespace sonicmoe::sm90 {

// The accumulator tile leaves in two halves of 64 rows (the two 64-row WGMMA blocks, mode 1 of
// the accumulator), so the staging buffer is half a tile: shared memory goes to mainloop stages.
template <int kTileM, int kTileN>
struct EpilogueTile {
  static constexpr int kHalfRows = 64;
  static constexpr int kHalves = kTileM / kHalfRows;
  static constexpr int kPitch = kTileN + 8;  // elements per shared-memory row
  using Element = cutlass::bfloat16_t;
  using SmemTile = Element[kHalfRows * kPitch];

  static __device__ void sync(int barrier_id) { cutlass::arch::NamedBarrier::sync(128, barrier_id); }

  // Rows of half h that hold data of the tile's expert.
  static __device__ int valid_rows(const VarlenTile& t, int h) {
    return max(0, min(kHalfRows, t.rows - h * kHalfRows));
  }

  // Writes the bf16 accumulator values of half h (column pairs) into smem.
  template <class Accumulator, class Coords>
  static __device__ void write_half(Element* smem, const Accumulator& accum, const Coords& coords, int h) {
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < cute::size<0>(accum); i += 2) {
      const auto rc = coords(i, h, 0);
      const int r = cute::get<0>(rc) - h * kHalfRows;
      *reinterpret_cast<__nv_bfloat162*>(smem + r * kPitch + cute::get<1>(rc)) =
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

// K2: out = A @ B^T, bf16, (m_total, n_out) row-major.
template <int kTileM, int kTileN>
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
    cute::array<int, kTileN / kBoxRowsB> rows;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kTileN / kBoxRowsB; ++i) rows[i] = t.n_block * kTileN + i * kBoxRowsB;
    return rows;
  }

  template <class Accumulator, class Coords>
  static __device__ void store(const Params& p, Element* smem, const Accumulator& accum,
                               const Coords& coords, const VarlenTile& t, int thread_idx,
                               int barrier_id) {
    const int col0 = t.n_block * kTileN;
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < Tile::kHalves; ++h) {
      const int rows = Tile::valid_rows(t, h);
      if (rows == 0) break;
      Tile::sync(barrier_id);  // the previous stores have read smem
      Tile::write_half(smem, accum, coords, h);
      Tile::sync(barrier_id);
      const int64_t row0 = t.row_start + h * Tile::kHalfRows;
      Tile::template store_rows<kTileN>(smem, rows, thread_idx, [&](int r, int chunk) -> Element* {
        const int col = col0 + chunk * 8;
        return col < p.n_out ? p.out + (row0 + r) * p.n_out + col : nullptr;
      });
    }
  }
};

// K1: the tile's N columns are gate columns [64 j, 64 j + 64) (w1 rows of the gate half) and
// the matching up columns (w1 rows n + 64 j ...), so both halves of SwiGLU meet in one thread.
// Stores H = [gate | up] (m_total, 2n) when kept for backward, and A = silu(gate) * up
// (m_total, n), computed from the fp32 accumulators.
template <int kTileM, int kTileN>
struct SwiGLUEpilogue {
  using Tile = EpilogueTile<kTileM, kTileN>;
  using Element = typename Tile::Element;
  static constexpr int kBoxRowsB = 64;
  static constexpr int kHalf = kTileN / 2;
  static_assert(kHalf == kBoxRowsB, "one B box per half");

  struct Params {
    Element* h = nullptr;  // nullptr: H is not kept (inference)
    Element* a = nullptr;
    int n = 0;             // intermediate size; w1 has 2n rows per expert
  };

  static __host__ __device__ int n_blocks(const Params& p) { return (p.n + kHalf - 1) / kHalf; }
  static __device__ cute::array<int, 2> b_rows(const Params& p, const VarlenTile& t) {
    return {t.n_block * kHalf,         // gate rows (past n: results are never stored)
            p.n + t.n_block * kHalf};  // up rows (past 2n: zero-filled by TMA)
  }

  template <class Accumulator, class Coords>
  static __device__ void store(const Params& p, Element* smem, const Accumulator& accum,
                               const Coords& coords, const VarlenTile& t, int thread_idx,
                               int barrier_id) {
    using namespace cute;
    // accum is ((2, 2, kTileN / 8), 2 halves, 1): value (v0, v1, j) is column 8 j + 2 (lane % 4) + v0,
    // so the up column matching gate column c (j < kTileN / 16) is value j + kTileN / 16.
    static_assert(decltype(size<0, 2>(accum))::value == kTileN / 8, "accumulator layout");
    constexpr int kGroups = kTileN / 16;
    const int col0 = t.n_block * kHalf;
    const int64_t h_pitch = 2 * int64_t(p.n);
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < Tile::kHalves; ++h) {
      const int rows = Tile::valid_rows(t, h);
      if (rows == 0) break;
      const int64_t row0 = t.row_start + h * Tile::kHalfRows;
      Tile::sync(barrier_id);
      if (p.h != nullptr) {
        Tile::write_half(smem, accum, coords, h);
        Tile::sync(barrier_id);
        Tile::template store_rows<kTileN>(smem, rows, thread_idx, [&](int r, int chunk) -> Element* {
          const int half = chunk / (kHalf / 8);
          const int col = col0 + (chunk % (kHalf / 8)) * 8;
          return col < p.n ? p.h + (row0 + r) * h_pitch + half * p.n + col : nullptr;
        });
        Tile::sync(barrier_id);
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
            act[v0] = gate / (1.0f + __expf(-gate)) * up;
          }
          const auto rc = coords(make_coord(make_coord(0, v1, j), h, 0));
          const int r = get<0>(rc) - h * Tile::kHalfRows;
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
