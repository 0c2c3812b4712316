// DGluSmemSourceEpilogue (K4 on the cooperative 128 x 256 tiles). Reads dA' (the
// accumulators), H by TMA into shared memory a quarter of the tile at a time, and row_score;
// computes and writes what DGluEpilogue does (d_h, a_scaled, d_score_partial).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cute/arch/copy_sm90_tma.hpp"
#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"

#include "sm90/epilogue/dglu_columns_sm90.cuh"
#include "sm90/epilogue/epilogue_tile_sm90.cuh"
#include "sm90/epilogue/store_helpers_sm90.cuh"
#include "sm90/epilogue/glu_chunks_sm90.cuh"
#include "sm90/ptx.cuh"
#include "common/varlen_tile_scheduler.cuh"

namespace sonicmoe::sm90 {

// K4 on the cooperative 128 x 256 tiles with H through shared memory: each warpgroup (64 rows)
// reads H a quarter of the tile (64 n columns) at a time, gate and up, by TMA into its own
// buffer: the first quarter is asked for when the warpgroup starts the tile's mainloop, each
// later one when the previous quarter's reads are done. The register path above waits a global
// round trip for every 8 column groups of a row pair (8 per tile); here the epilogue waits at most
// three TMA loads per tile, and H takes no registers while it is in flight. Math, stores and the
// score slots as in DGluEpilogue.
template <int kTileM, int kTileN, GluActivation kAct>
struct DGluSmemSourceEpilogue : DGluColumns<kTileN> {
  static_assert(kTileM == 128 && kTileN == 256, "the cooperative 128 x 256 tiles: 64 rows per warpgroup");
  using Tile = EpilogueTile<kTileM, kTileN>;
  using Element = typename Tile::Element;
  using Columns = DGluColumns<kTileN>;
  using Columns::kSlotCols;
  static constexpr int kRows = 64;          // a warpgroup's rows of the tile
  static constexpr int kQuarterCols = 64;   // n columns per H load: one 128-byte swizzle row
  static constexpr int kQuarters = kTileN / kQuarterCols;
  static constexpr uint32_t kQuarterBytes = 2 * kRows * kQuarterCols * sizeof(Element);

  // A warpgroup's quarter of H: gate and up columns, each a 64 x 64 TMA box in the 128-byte
  // swizzle (16-byte chunk c of row r at chunk c ^ (r % 8)); `full` completes when both land.
  struct alignas(1024) SmemTile {
    Element gate[kRows * kQuarterCols];
    Element up[kRows * kQuarterCols];
    uint64_t full;
  };

  struct Params {
    CUtensorMap tma_h;                 // H (m_total, 2n) in boxes of 64 columns x 64 rows
    const float* row_score = nullptr;  // (m_total)
    Element* d_h = nullptr;            // (m_total, 2n)
    Element* a_scaled = nullptr;       // (m_total, n)
    float* d_score_partial = nullptr;  // (m_total, ceil(n / kSlotCols))
    int n = 0;
  };

  // Once per CTA, by one thread, before the barriers' init fence.
  static __device__ void init_source(const Params& p, SmemTile (&s)[2]) {
    cutlass::arch::ClusterBarrier::init(&s[0].full, 1);
    cutlass::arch::ClusterBarrier::init(&s[1].full, 1);
    cute::prefetch_tma_descriptor(&p.tma_h);
  }

  // Thread 0 of the warpgroup asks for quarter q of its rows' H. Rows past the expert or past
  // m_total arrive too (zero past m_total); their results are never stored.
  static __device__ void issue_quarter(const Params& p, SmemTile& s, const VarlenTile& t, int row0, int q) {
    constexpr uint64_t kCacheHint = static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_FIRST);
    const int col = t.n_block * kTileN + q * kQuarterCols;
    const int row = t.row_start + row0;
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&s.full, kQuarterBytes);
    cute::SM90_TMA_LOAD_2D::copy(&p.tma_h, &s.full, kCacheHint, s.gate, col, row);
    cute::SM90_TMA_LOAD_2D::copy(&p.tma_h, &s.full, kCacheHint, s.up, p.n + col, row);
  }

  // Called by the warpgroup as it starts the tile's mainloop: the first quarter.
  template <class Coords>
  static __device__ void load_source(const Params& p, SmemTile& s, const VarlenTile& t, const Coords& coords,
                                     int thread_idx) {
    if (thread_idx == 0) issue_quarter(p, s, t, Tile::half_row(coords, 0), 0);
  }

  template <class Accumulator, class Coords>
  static __device__ void store(const Params& p, SmemTile& s, const Accumulator& accum, const Coords& coords,
                               const VarlenTile& t, int thread_idx, int barrier_id) {
    using namespace cute;
    static_assert(decltype(size<1>(accum))::value == 1, "one 64-row half per warpgroup");
    const int col0 = t.n_block * kTileN;
    const int row0 = Tile::half_row(coords, 0);
    const int64_t h_pitch = 2 * int64_t(p.n);
    const int slots = (p.n + kSlotCols - 1) / kSlotCols;
    constexpr int kGroups = kQuarterCols / 8;  // 8-column groups per quarter
    constexpr int kSlotQuarters = kSlotCols / kQuarterCols;
    float score[2], d_score[2] = {0.f, 0.f};
    CUTLASS_PRAGMA_UNROLL
    for (int v1 = 0; v1 < 2; ++v1) {
      const int r = get<0>(coords(make_coord(make_coord(0, v1, 0), 0, 0)));
      score[v1] = r < t.rows ? p.row_score[t.row_start + r] : 0.f;
    }
    const uint32_t gate_base = cast_smem_ptr_to_uint(s.gate), up_base = cast_smem_ptr_to_uint(s.up);
    CUTLASS_PRAGMA_UNROLL
    for (int q = 0; q < kQuarters; ++q) {
      // Four loads per tile: quarter q's wait is the (4 j + q)-th on this barrier, parity q % 2.
      cutlass::arch::ClusterBarrier::wait(&s.full, q % 2);
      CUTLASS_PRAGMA_UNROLL
      for (int v1 = 0; v1 < 2; ++v1) {
        const int r = get<0>(coords(make_coord(make_coord(0, v1, 0), 0, 0)));
        const int local = r - row0;  // row in the warpgroup's boxes
        const bool row_ok = r < t.rows;
        const int64_t row = t.row_start + r;
        CUTLASS_PRAGMA_UNROLL
        for (int q0 = 0; q0 < kGroups; q0 += 4) {
          const int j0 = q * kGroups + q0;  // the accumulator's column group
          const int col = col0 + quad_chunk_col(coords, v1, j0, 0);
          const int chunk = (col - col0 - q * kQuarterCols) / 8;  // 16-byte chunk in the box row
          const uint32_t offset = swizzle128_offset(local, chunk);
          uint32_t g4[4], u4[4];
          load_shared_16B(g4, gate_base + offset);
          load_shared_16B(u4, up_base + offset);
          reorder_h_chunks(g4, u4, col, p.n);
          uint32_t dg4[4], du4[4], as4[4];
          dglu_groups<kAct>(accum, v1, 0, j0, score[v1], g4, u4, dg4, du4, as4, d_score[v1]);
          quad_transpose(dg4);
          quad_transpose(du4);
          quad_transpose(as4);
          if (row_ok && col < p.n) {
            Element* d_h_row = p.d_h + row * h_pitch;
            store_16B(d_h_row + col, dg4);
            store_16B(d_h_row + p.n + col, du4);
            store_16B(p.a_scaled + row * p.n + col, as4);
          }
        }
        if ((q + 1) % kSlotQuarters == 0) {
          Columns::store_slot(p, d_score[v1], row_ok, row, t.n_block, q / kSlotQuarters, slots);
          d_score[v1] = 0.f;
        }
      }
      // Every thread's reads of the buffer are done before TMA writes it again (the next quarter,
      // or the next tile's first, issued by this warpgroup's thread 0).
      Tile::sync(barrier_id);
      if (q + 1 < kQuarters && thread_idx == 0) {
        cutlass::arch::fence_view_async_shared();
        issue_quarter(p, s, t, row0, q + 1);
      }
    }
    if (thread_idx == 0) cutlass::arch::fence_view_async_shared();
  }
};

}  // namespace sonicmoe::sm90
