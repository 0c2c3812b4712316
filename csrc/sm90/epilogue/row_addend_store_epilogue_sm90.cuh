// RowAddendStoreEpilogue (K6 with the router's part of dx). Reads addend_scale (m_total) fp32 and
// addend_rows (num_experts, n_out) bf16 into shared memory by cp.async as the tile's mainloop
// starts; computes out = accumulators + addend_scale[r] * addend_rows[e] in fp32; writes out as
// bf16 like StoreEpilogue's quad-transposed stores.
#pragma once

#include <cstdint>

#include "cute/tensor.hpp"

#include "sm90/epilogue/epilogue_tile_sm90.cuh"
#include "sm90/epilogue/store_epilogue_sm90.cuh"
#include "sm90/ptx.cuh"
#include "common/varlen_tile_scheduler.cuh"

namespace sonicmoe::sm90 {

// K6 with a rank-one addend per expert: out[r] = a[r] @ b[e] + addend_scale[r] * addend_rows[e],
// summed in fp32 before the one bf16 rounding. The router's part of dx, d_logits @ router_weight,
// is this where d_logits is zero off each token's chosen experts (topk_softmax, softmax_topk_norm):
// row r of expert e adds d_logits[t, e] * router_weight[e], which removes the dense GEMM and its
// T x d addend that K8 would read. As the warpgroup starts a tile's mainloop it asks by cp.async
// for its rows' scales (4 bytes a row: expert ranges start anywhere) and the tile's columns of
// addend_rows[e] (16-byte chunks), so the epilogue finds them in shared memory.
template <int kTileM, int kTileN>
struct RowAddendStoreEpilogue {
  using Base = StoreEpilogue<kTileM, kTileN, TileStore::kQuadTranspose>;
  using Tile = typename Base::Tile;
  using Element = typename Base::Element;
  static constexpr int kBoxRowsB = Base::kBoxRowsB;
  // A warpgroup's rows: one 64-row half (cooperative 128 x 256) or two (ping-pong 128 x 128, rows
  // 0 and 64; cooperative 256 x 128, rows 64 w and 64 w + 128: not one range).
  static constexpr int kMaxRows = 2 * Tile::kHalfRows;

  struct alignas(16) SmemTile {
    Element rows[kTileN];    // the tile's columns of addend_rows[e]
    float scale[kMaxRows];   // addend_scale of the warpgroup's rows, half by half
  };

  struct Params : Base::Params {
    const float* addend_scale = nullptr;  // (m_total)
    const Element* addend_rows = nullptr;  // (num_experts, n_out)
    int m_total = 0;
  };

  static __host__ __device__ int n_blocks(const Params& p) { return Base::n_blocks(p); }
  static __device__ cute::array<int, kTileN / kBoxRowsB> b_rows(const Params& p, const VarlenTile& t) {
    return Base::b_rows(p, t);
  }

  // Nothing to set up (cp.async needs no barrier); its presence makes the kernel call load_source.
  static __device__ void init_source(const Params&, SmemTile (&)[2]) {}

  template <class Coords>
  static __device__ void load_source(const Params& p, SmemTile& s, const VarlenTile& t, const Coords& coords,
                                     int thread_idx) {
    constexpr int kRows = Tile::kHalfRows * decltype(cute::size<1>(coords))::value;
    static_assert(kRows <= kMaxRows && kTileN / 8 <= 128, "one copy a thread");
    if (thread_idx < kRows) {
      const int h = thread_idx / Tile::kHalfRows;
      const int row = t.row_start + Tile::half_row(coords, h) + thread_idx % Tile::kHalfRows;
      const bool ok = row < p.m_total;
      cp_async_4_zfill(&s.scale[thread_idx], ok ? p.addend_scale + row : p.addend_scale, ok);
    }
    if (thread_idx < kTileN / 8) {
      const int col = t.n_block * kTileN + 8 * thread_idx;
      const bool ok = col < p.n_out;
      const Element* src = p.addend_rows + int64_t(t.expert) * p.n_out + (ok ? col : 0);
      cp_async_16_zfill(&s.rows[8 * thread_idx], src, ok);
    }
    cp_async_commit_group();
  }

  template <class Accumulator, class Coords>
  static __device__ void store(const Params& p, SmemTile& s, const Accumulator& accum, const Coords& coords,
                               const VarlenTile& t, int /*thread_idx*/, int barrier_id) {
    using namespace cute;
    constexpr int kHalves = decltype(size<1>(accum))::value;
    constexpr int kGroups = decltype(size<0, 2>(accum))::value;
    // This lane's column pair of each group is the same in every row it holds: one bf16 pair. With
    // at most 128 accumulators a thread the pairs stay in registers through the stores. The
    // ping-pong 128 x 192 tile's 192 leave no room for 24 more (held, or loaded ahead of their
    // uses, they spilled at the consumers' 232 registers): each pair is loaded where it is added,
    // by a volatile load that the compiler does not merge with the same pair's other loads, and
    // the barrier that guards the next tile's copies follows the stores.
    constexpr bool kRowsInRegisters = decltype(size(accum))::value <= 128;
    const auto pair_at = [&](int g) { return &s.rows[get<1>(coords(make_coord(make_coord(0, 0, g), 0, 0)))]; };
    cp_async_wait_all();
    Tile::sync(barrier_id);  // every thread's copies have landed
    uint32_t rows[kRowsInRegisters ? kGroups : 1];
    if constexpr (kRowsInRegisters) {
      CUTLASS_PRAGMA_UNROLL
      for (int g = 0; g < kGroups; ++g) rows[g] = *reinterpret_cast<const uint32_t*>(pair_at(g));
    }
    float scale[kHalves][2];
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < kHalves; ++h) {
      const int half_row = Tile::half_row(coords, h);
      CUTLASS_PRAGMA_UNROLL
      for (int v1 = 0; v1 < 2; ++v1) {
        const int r = get<0>(coords(make_coord(make_coord(0, v1, 0), h, 0)));
        scale[h][v1] = s.scale[h * Tile::kHalfRows + r - half_row];
      }
    }
    if constexpr (kRowsInRegisters) Tile::sync(barrier_id);  // every read is done before the next tile's copies
    Base::store_quad_transposed(p, accum, coords, t, [&](int h, int v1, int g, float& lo, float& hi) {
      uint32_t row;
      if constexpr (kRowsInRegisters)
        row = rows[g];
      else
        row = load_shared_4B_volatile(cute::cast_smem_ptr_to_uint(pair_at(g)));
      lo = fmaf(scale[h][v1], __uint_as_float(row << 16), lo);
      hi = fmaf(scale[h][v1], __uint_as_float(row & 0xffff0000u), hi);
    });
    if constexpr (!kRowsInRegisters) Tile::sync(barrier_id);  // as above, after the stores' reads
  }
};

}  // namespace sonicmoe::sm90
