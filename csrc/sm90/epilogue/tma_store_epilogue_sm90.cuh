// TmaStoreEpilogue (K5 / K7 on the cooperative tiles). Reads nothing but the accumulators;
// computes their bf16 rounding into swizzled 64 x 64 boxes in shared memory; writes out
// (num_experts, m_out, n_out), or its per-expert transpose, by TMA stores that clip at the
// output's and the expert's edges (varlen K: every expert owns a whole output).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cute/arch/copy_sm90_tma.hpp"
#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"

#include "sm90/epilogue/epilogue_tile_sm90.cuh"
#include "sm90/epilogue/store_helpers_sm90.cuh"
#include "sm90/ptx.cuh"
#include "common/varlen_tile_scheduler.cuh"

namespace sonicmoe::sm90 {

// K5 / K7 on the cooperative tiles, whose K loops can be short (8 k steps per 64 KB output tile
// at 512 rows an expert): each warpgroup writes its 64 accumulator rows as bf16 into its own
// buffer of 64 x 64 boxes (128-byte swizzle), one thread stores the boxes by TMA, and the
// warpgroup goes on to the next tile's mainloop while the global writes drain. The buffer is
// waited on (TMA's reads of it) only before the next tile's writes. The output is a 3-D map (E,
// rows, cols): TMA clips at m_out, n_out and the expert, so no row test is needed. kTransposed:
// the tile holds out[e]^T (K7 in K5's shape); a box is 64 output rows (tile columns) x 64 output
// columns (tile rows).
template <int kTileM, int kTileN, bool kTransposed>
struct TmaStoreEpilogue {
  using Tile = EpilogueTile<kTileM, kTileN>;
  using Element = typename Tile::Element;
  static constexpr int kBox = 64;  // a box is kBox x kBox: one 128-byte swizzle row wide (the host's map)
  static constexpr int kBoxes = kTileN / kBox;
  static constexpr int kBoxBytes = kBox * kBox * sizeof(Element);
  static_assert(kTileM == 2 * kBox && kTileN % kBox == 0, "the cooperative tiles: a box's rows per warpgroup");

  struct alignas(1024) SmemTile {
    Element boxes[kBoxes * kBox * kBox];
  };

  struct Params {
    CUtensorMap tma_out;  // (E, m_out, n_out) as (n_out, m_out, E); kTransposed (E, n_out, m_out)
    int n_out = 0;        // the tiles' column extent
  };

  static __host__ __device__ int n_blocks(const Params& p) { return (p.n_out + kTileN - 1) / kTileN; }
  static __device__ cute::array<int, 1> b_rows(const Params&, const VarlenTile&) { return {}; }  // varlen K: unused

  template <class Accumulator, class Coords>
  static __device__ void store(const Params& p, SmemTile& s, const Accumulator& accum, const Coords& coords,
                               const VarlenTile& t, int thread_idx, int barrier_id) {
    using namespace cute;
    static_assert(decltype(size<1>(accum))::value == 1, "one 64-row half per warpgroup");
    const int row0 = Tile::half_row(coords, 0);
    if (thread_idx == 0) tma_store_wait<0>();  // the previous tile's boxes have been read
    Tile::sync(barrier_id);
    // Values i, i + 1 of mode 0 are columns c, c + 1 of one row (c even): value (v0, v1, g) = i
    // is tile row 16 warp + lane / 4 + 8 v1, column 8 g + 2 (lane % 4) + v0.
    static_assert(decltype(size<0>(accum))::value == kTileN / 2, "accumulator layout: (2, 2, kTileN / 8)");
    const uint32_t base = cast_smem_ptr_to_uint(s.boxes);
    if constexpr (kTransposed) {
      // One stmatrix.x4.trans per pair of column groups p: its matrix j (v1 = j % 2, g = 2 p + j / 2)
      // is the 8 x 8 block whose pairs are values 8 p + 2 j, 8 p + 2 j + 1, and lane l names the
      // l % 8-th row in memory of matrix l / 8: tile column c = 8 g + l % 8, i.e. row c % 64 of box
      // g / 8, holding tile rows 16 warp + 8 v1 + 0..7 (chunk 2 warp + v1). The box row's swizzle
      // key is l % 8, so the address is one per thread plus a constant per p. 16 instructions a
      // thread where 2-byte stores took 128: K7 2% faster at deepseek-v3.
      const int lane = thread_idx % 32, warp = thread_idx / 32;
      const int m = lane / 8, l8 = lane % 8;
      const uint32_t thread_base = base + swizzle128_offset(8 * (m / 2) + l8, 2 * warp + m % 2);
      CUTLASS_PRAGMA_UNROLL
      for (int p = 0; p < kTileN / 16; ++p) {
        uint32_t v[4];
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < 4; ++j) v[j] = pack_bf16x2(accum(8 * p + 2 * j, 0, 0), accum(8 * p + 2 * j + 1, 0, 0));
        stmatrix_x4_trans(thread_base + (p / 4) * kBoxBytes + (p % 4) * 2048, v);
      }
    } else {
      // One 4-byte store per pair (a warp's 32 hit 8 rows whose chunks the swizzle spreads; the
      // non-transposed stmatrix ran K5 1-3% slower).
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size<0>(accum); i += 2) {
        const auto rc = coords(i, 0, 0);
        const int r = get<0>(rc) - row0, c = get<1>(rc);
        const uint32_t at = base + (c / kBox) * kBoxBytes + swizzle128_offset(r, (c % kBox) / 8) + (c % 8) * 2;
        store_shared_4B(at, pack_bf16x2(accum(i, 0, 0), accum(i + 1, 0, 0)));
      }
    }
    cutlass::arch::fence_view_async_shared();  // the writes, visible to TMA
    Tile::sync(barrier_id);
    if (thread_idx == 0 && t.rows > 0) {  // rows 0: a cluster pair's empty half
      const int i0 = t.m_block * kTileM + row0, j0 = t.n_block * kTileN;
      CUTLASS_PRAGMA_UNROLL
      for (int b = 0; b < kBoxes; ++b) {
        if (j0 + kBox * b >= p.n_out) break;
        if constexpr (kTransposed)
          SM90_TMA_STORE_3D::copy(&p.tma_out, s.boxes + b * kBox * kBox, i0, j0 + kBox * b, t.expert);
        else
          SM90_TMA_STORE_3D::copy(&p.tma_out, s.boxes + b * kBox * kBox, j0 + kBox * b, i0, t.expert);
      }
      tma_store_arrive();
    }
  }

  // After the warpgroup's last tile: TMA has read its buffer before the CTA's shared memory goes.
  static __device__ void finish(int thread_idx) {
    if (thread_idx == 0) cute::tma_store_wait<0>();
  }
};

}  // namespace sonicmoe::sm90
