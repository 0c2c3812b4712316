// Epilogues of the sm90 varlen grouped GEMMs. Each one also says which weight rows form a
// tile's N columns (the B box origins the mainloop loads), since that pairing is what makes
// the SwiGLU fusion possible.
//
// Varlen M: stores leave as 16-byte row chunks, predicated on the tile's valid rows: a tile may
// end inside its expert's last m block, and the rows after it belong to the next expert, so no
// store may touch them (TMA stores cannot clip there). The chunks are formed either in a
// per-warpgroup shared-memory tile (rows padded by 8 elements so the accumulator writes hit 32
// distinct banks) or in registers by a transpose across each quad (TileStore). Varlen K (K5 / K7:
// every expert owns a whole output) stores by TMA on the cooperative tiles
// (varlen_k_epilogue_sm90.cuh).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <utility>

#include "cute/arch/copy_sm90_tma.hpp"
#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/bfloat16.h"

#include "common/h_column_order.h"
#include "sm90/collective/wgmma_consumer_sm90.cuh"
#include "sm90/varlen_tile_scheduler.cuh"

namespace sonicmoe::sm90 {

// tanh by one MUFU.TANH (max relative error ~2^-11, below the bf16 rounding of every result it
// feeds). sigmoid(x) = (1 + tanh(x / 2)) / 2 takes one MUFU where exp and a reciprocal
// (__fdividef) took two: the SwiGLU epilogues (K1, K4) do not overlap the MMAs, and K4 on its
// cooperative tiles ran 1-7% faster for it, level on ping-pong (docs/perf-notes.md, session 20).
// tanh saturates to +-1, so silu is exactly 0 for large negative inputs.
__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// silu(x) = x sigmoid(x) = h + h tanh(h), h = x / 2.
__device__ __forceinline__ float fast_silu(float x) {
  const float half = 0.5f * x;
  return fmaf(half, tanh_approx(half), half);
}

// Two floats as a bf16 pair in one register (the lower column in the low half).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// One 16-byte global store (the address is 16-byte aligned). nvcc split a plain uint4 store
// through an offset by a runtime element count into four 4-byte ones.
__device__ __forceinline__ void store_16B(void* dst, const uint32_t (&v)[4]) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3])
               : "memory");
}

// One 16-byte global load of data the kernel does not write (the address is 16-byte aligned),
// or zeros when !valid. Not volatile: the compiler may schedule it like a plain load.
__device__ __forceinline__ void load_16B(uint32_t (&v)[4], const void* src, bool valid) {
  if (valid) {
    asm("ld.global.nc.v4.b32 {%0, %1, %2, %3}, [%4];\n"
        : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
        : "l"(src));
  } else {
    v[0] = v[1] = v[2] = v[3] = 0u;
  }
}

// One 16-byte shared-memory load (addr: a shared-window address, 16-byte aligned).
__device__ __forceinline__ void load_shared_16B(uint32_t (&v)[4], uint32_t addr) {
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
               : "r"(addr));
}

// Byte offset of 16-byte chunk `chunk` (< 8) of row `row` in a tile of 128-byte rows in TMA's
// 128-byte swizzle (a 64-column bf16 box): the chunk moves to chunk ^ (row % 8).
__device__ __forceinline__ uint32_t swizzle128_offset(int row, int chunk) {
  return row * 128 + ((chunk ^ (row % 8)) * 16);
}

// Transposes a 4 x 4 matrix of registers across the 4 lanes of a quad: lane l's x[i] becomes
// lane i's x[l] (two butterfly rounds, one shuffle per pair of registers and round).
__device__ __forceinline__ void quad_transpose(uint32_t (&x)[4]) {
  const int lane = threadIdx.x % 4;
  CUTLASS_PRAGMA_UNROLL
  for (int mask = 1; mask <= 2; mask *= 2) {
    const bool upper = lane & mask;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < 4; ++i) {
      if (i & mask) continue;
      // Pair (i, i + mask): keep the entry on this lane's side, trade the other one.
      const uint32_t received = __shfl_xor_sync(0xffffffffu, upper ? x[i] : x[i + mask], mask);
      if (upper) x[i] = received; else x[i + mask] = received;
    }
  }
}

// After quad_transpose of 4 column groups starting at group q0, lane l of a quad holds group
// q0 + l of its row: its first tile column is the quad's first one (this lane's column of value
// (0, v1, q0), less 2 l) plus 8 l.
template <class Coords>
__device__ __forceinline__ int quad_chunk_col(const Coords& coords, int v1, int q0, int half) {
  const int quad_lane = threadIdx.x % 4;
  return cute::get<1>(coords(cute::make_coord(cute::make_coord(0, v1, q0), half, 0))) - 2 * quad_lane +
         8 * quad_lane;
}

// Whether the 32-column block of H holding this lane's chunk at half column `col` (from
// quad_chunk_col) is whole, and so in fragment order (common/h_column_order.h): there the lane's
// own four column pairs are its chunk, and no quad transpose is needed. The same for the whole
// warp (its lanes share the columns).
__device__ __forceinline__ bool h_block_in_fragment_order(int col, int n) {
  return col - 8 * int(threadIdx.x % 4) + kHBlockCols <= n;
}

// This lane's gate and up chunks of H at half column `col`, between H's stored order and the
// accumulator's layout (either way: the quad transpose is its own inverse): nothing to do in a
// whole 32-column block, a transpose in a trailing partial one (stored in column order).
__device__ __forceinline__ void reorder_h_chunks(uint32_t (&gate4)[4], uint32_t (&up4)[4], int col, int n) {
  if (h_block_in_fragment_order(col, n)) return;
  quad_transpose(gate4);
  quad_transpose(up4);
}

// How a bf16 result tile leaves registers. kStaged: through the warpgroup's shared-memory tile,
// two named barriers per window, then 16-byte row chunks. kQuadTranspose: the bf16 pairs of 4
// consecutive column groups are transposed across the quad and each lane stores one group's 8
// columns as one 16-byte chunk; no shared memory and no barrier. Which one is faster depends on
// the kernel (docs/perf-notes.md, session 10): the launchers choose.
enum class TileStore { kStaged, kQuadTranspose };

// A warpgroup's accumulators leave in halves of 64 rows (its 64-row WGMMA blocks, mode 1 of
// the accumulator) and windows of at most 128 columns, so the staging buffer is one 64 x 128
// window: shared memory goes to mainloop stages. A ping-pong warpgroup owns the whole tile
// (halves at rows 0 and 64); in a cooperative tile the coordinates say where its halves start.
template <int kTileM, int kTileN>
struct EpilogueTile {
  static constexpr int kHalfRows = 64;
  static constexpr int kWindowCols = kTileN < 128 ? kTileN : 128;
  static constexpr int kWindows = kTileN / kWindowCols;
  static constexpr int kPitch = kWindowCols + 8;  // elements per shared-memory row
  using Element = cutlass::bfloat16_t;
  using SmemTile = Element[kHalfRows * kPitch];
  static_assert(kTileN % kWindowCols == 0, "whole windows");

  static __device__ void sync(int barrier_id) { cutlass::arch::NamedBarrier::sync(128, barrier_id); }

  // Accumulator halves of this warpgroup (mode 1 of the accumulator).
  template <class Accumulator>
  static constexpr int halves(const Accumulator&) {
    return decltype(cute::size<1>(std::declval<const Accumulator&>()))::value;
  }

  // First tile row of this warpgroup's half h.
  template <class Coords>
  static __device__ int half_row(const Coords& coords, int h) {
    return cute::get<0>(coords(0, h, 0)) / kHalfRows * kHalfRows;
  }

  // Rows of the half starting at tile row `row` that hold data of the tile's expert.
  static __device__ int valid_rows(const VarlenTile& t, int row) { return max(0, min(kHalfRows, t.rows - row)); }

  // Writes the bf16 accumulator values of half h (starting at tile row `row`) in window w
  // (tile columns [128 w, 128 w + 128)) into smem, column pairs at a time. The accumulator's
  // mode 0 is (2, 2, kTileN / 8): value i sits in column 8 (i / 4) + ..., so a window is the
  // contiguous value range [kWindowCols w / 2, kWindowCols (w + 1) / 2).
  // col_map(tile column) gives the tile column the value is stored at (H's column order).
  template <int w, class Accumulator, class Coords, class ColMap = cute::identity>
  static __device__ void write_half(Element* smem, const Accumulator& accum, const Coords& coords, int h,
                                    int row, ColMap col_map = {}) {
    static_assert(decltype(cute::size<0, 2>(accum))::value == kTileN / 8, "accumulator layout");
    CUTLASS_PRAGMA_UNROLL
    for (int i = kWindowCols * w / 2; i < kWindowCols * (w + 1) / 2; i += 2) {
      const auto rc = coords(i, h, 0);
      const int r = cute::get<0>(rc) - row;
      *reinterpret_cast<__nv_bfloat162*>(smem + r * kPitch + col_map(cute::get<1>(rc)) - kWindowCols * w) =
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

// The B rows (w's output columns) of an n tile of kTileN contiguous columns, in boxes of
// kBoxRows: what b_rows returns for every epilogue but SwiGLU's (whose tile is two halves).
template <int kTileN, int kBoxRows>
__device__ __forceinline__ cute::array<int, kTileN / kBoxRows> contiguous_b_rows(const VarlenTile& t) {
  cute::array<int, kTileN / kBoxRows> rows;
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < kTileN / kBoxRows; ++i) rows[i] = t.n_block * kTileN + i * kBoxRows;
  return rows;
}

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
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  }

  template <class Accumulator, class Coords>
  static __device__ void store(const Params& p, SmemTile& s, const Accumulator& accum, const Coords& coords,
                               const VarlenTile& t, int /*thread_idx*/, int barrier_id) {
    using namespace cute;
    constexpr int kHalves = decltype(size<1>(accum))::value;
    constexpr int kGroups = decltype(size<0, 2>(accum))::value;
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    Tile::sync(barrier_id);  // every thread's copies have landed
    // This lane's column pair of each group is the same in every row it holds: one bf16 pair.
    uint32_t rows[kGroups];
    CUTLASS_PRAGMA_UNROLL
    for (int g = 0; g < kGroups; ++g)
      rows[g] = *reinterpret_cast<const uint32_t*>(&s.rows[get<1>(coords(make_coord(make_coord(0, 0, g), 0, 0)))]);
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
    Tile::sync(barrier_id);  // every read is done before the next tile's copies
    Base::store_quad_transposed(p, accum, coords, t, [&](int h, int v1, int g, float& lo, float& hi) {
      lo = fmaf(scale[h][v1], __uint_as_float(rows[g] << 16), lo);
      hi = fmaf(scale[h][v1], __uint_as_float(rows[g] & 0xffff0000u), hi);
    });
  }
};

// K1: the tile's N columns are kTileN / 2 gate columns (w1 rows of the gate half, from
// n_block * kTileN / 2) and the matching up columns (w1 rows n + ...), so both halves of SwiGLU
// meet in one thread.
// Stores H = [gate | up] (m_total, 2n; in H's column order, common/h_column_order.h) when kept
// for backward, and A = silu(gate) * up (m_total, n), computed from the fp32 accumulators.
template <int kTileM, int kTileN, TileStore kStore>
struct SwiGLUEpilogue {
  using Tile = EpilogueTile<kTileM, kTileN>;
  using Element = typename Tile::Element;
  static constexpr int kBoxRowsB = 64;
  static constexpr int kHalf = kTileN / 2;
  static constexpr int kBoxesPerHalf = kHalf / kBoxRowsB;
  static_assert(kHalf % kBoxRowsB == 0 && kHalf <= Tile::kWindowCols, "whole B boxes; A fits one window");

  struct Params {
    Element* h = nullptr;  // nullptr: H is not kept (inference)
    Element* a = nullptr;
    int n = 0;             // intermediate size; w1 has 2n rows per expert
  };

  static __host__ __device__ int n_blocks(const Params& p) { return (p.n + kHalf - 1) / kHalf; }
  // Gate rows (past n: results are never stored), then up rows (past 2n: zero-filled by TMA).
  static __device__ cute::array<int, 2 * kBoxesPerHalf> b_rows(const Params& p, const VarlenTile& t) {
    cute::array<int, 2 * kBoxesPerHalf> rows;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kBoxesPerHalf; ++i) {
      rows[i] = t.n_block * kHalf + i * kBoxRowsB;
      rows[kBoxesPerHalf + i] = p.n + t.n_block * kHalf + i * kBoxRowsB;
    }
    return rows;
  }

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
            act4[b] = pack_bf16x2(fast_silu(g0) * u0, fast_silu(g1) * u1);
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
            act[v0] = fast_silu(gate) * up;
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

// K4 (backward through the down-projection and SwiGLU). The accumulators are dA' = dO[gather] @ w2[e]
// over kTileN (128 or 256) of the n columns; with H (kept by K1) and the row's score s:
//   A = silu(gate) * up, dA = s * dA',
//   dH = [dA * up * silu'(gate), dA * silu(gate)], A' = s * A, dS partial = sum_c dA' * A.
// H arrives in registers as 16-byte chunks already in the accumulator's layout (H's column
// order, common/h_column_order.h; a trailing partial block is transposed across the quad); dH
// and A' leave in column order, transposed across each quad into 16-byte chunks
// (TileStore::kQuadTranspose; staging them through shared memory measured slower:
// docs/perf-notes.md, session 9). The dS partial of each row and 128-column slot (kSlotCols)
// goes to its own place, summed over the slots in a fixed order later (deterministic, no
// atomics).
// K4's math for the 4 column groups j0 .. j0 + 3 of accumulator row (v1, m): g4 / u4 hold H's gate
// and up pairs in the accumulator's layout; returns dH's gate and up pairs
// and A' = s * A, and adds the row's dS terms to d_score.
template <class Accumulator>
__device__ __forceinline__ void dswiglu_groups(const Accumulator& accum, int v1, int m, int j0, float score,
                                               const uint32_t (&g4)[4], const uint32_t (&u4)[4], uint32_t (&dg4)[4],
                                               uint32_t (&du4)[4], uint32_t (&as4)[4], float& d_score) {
  using namespace cute;
  CUTLASS_PRAGMA_UNROLL
  for (int b = 0; b < 4; ++b) {
    const float2 g = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&g4[b]));
    const float2 u = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u4[b]));
    float dg[2], du[2], as[2];
    CUTLASS_PRAGMA_UNROLL
    for (int v0 = 0; v0 < 2; ++v0) {
      const float gate = v0 ? g.y : g.x, up = v0 ? u.y : u.x;
      const float d_a_prime = accum(make_coord(make_coord(v0, v1, j0 + b), m, 0));
      // From the one tanh (see tanh_approx): sig, silu and silu' = sig + silu (1 - sig) by FMAs.
      const float half = 0.5f * gate;
      const float t = tanh_approx(half);
      const float sig = fmaf(0.5f, t, 0.5f);
      const float silu = fmaf(half, t, half);
      const float d_silu = fmaf(silu, fmaf(-0.5f, t, 0.5f), sig);
      const float a = silu * up;
      d_score = fmaf(d_a_prime, a, d_score);
      const float d_a = score * d_a_prime;
      dg[v0] = d_a * up * d_silu;
      du[v0] = d_a * silu;
      as[v0] = score * a;
    }
    dg4[b] = pack_bf16x2(dg[0], dg[1]);
    du4[b] = pack_bf16x2(du[0], du[1]);
    as4[b] = pack_bf16x2(as[0], as[1]);
  }
}

// What K4's two epilogues share (DSwiGLUEpilogue: H in registers; DSwiGLUSmemSourceEpilogue: H
// through shared memory): the n tiles, their B rows, and the score slots. d_score_partial has one
// slot per 128 columns of n (kDownProjGradBlockCols): a 128-column tile writes one, a 256-column
// tile two.
template <int kTileN>
struct DSwiGLUColumns {
  static constexpr int kBoxRowsB = 64;
  static constexpr int kSlotCols = 128;
  static_assert(kTileN % kSlotCols == 0, "whole score slots per tile");

  template <class Params>
  static __host__ __device__ int n_blocks(const Params& p) { return (p.n + kTileN - 1) / kTileN; }
  template <class Params>
  static __device__ cute::array<int, kTileN / kBoxRowsB> b_rows(const Params&, const VarlenTile& t) {
    return contiguous_b_rows<kTileN, kBoxRowsB>(t);
  }

  // A row's dS over one slot's columns (`slot` of the tile): the 4 lanes of a quad hold the same
  // row's columns, summed in a fixed order. A slot past n (a 256-column tile's second half) has
  // no place and holds only zeros.
  template <class Params>
  static __device__ void store_slot(const Params& p, float d_score, bool row_ok, int64_t row, int n_block, int slot,
                                    int slots) {
    d_score += __shfl_xor_sync(0xffffffffu, d_score, 1);
    d_score += __shfl_xor_sync(0xffffffffu, d_score, 2);
    slot += n_block * (kTileN / kSlotCols);
    if (row_ok && threadIdx.x % 4 == 0 && slot < slots) p.d_score_partial[row * slots + slot] = d_score;
  }
};

template <int kTileM, int kTileN>
struct DSwiGLUEpilogue : DSwiGLUColumns<kTileN> {
  using Tile = EpilogueTile<kTileM, kTileN>;
  using Element = typename Tile::Element;
  using Columns = DSwiGLUColumns<kTileN>;
  using Columns::kSlotCols;

  struct Params {
    const Element* h = nullptr;       // (m_total, 2n)
    const float* row_score = nullptr;  // (m_total)
    Element* d_h = nullptr;           // (m_total, 2n)
    Element* a_scaled = nullptr;      // (m_total, n)
    float* d_score_partial = nullptr;  // (m_total, ceil(n / kSlotCols))
    int n = 0;
  };

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
            dswiglu_groups(accum, v1, m, j0 + q0, score, g4[q0 / 4], u4[q0 / 4], dg4, du4, as4, d_score);
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

// K4 on the cooperative 128 x 256 tiles with H through shared memory: each warpgroup (64 rows)
// reads H a quarter of the tile (64 n columns) at a time, gate and up, by TMA into its own
// buffer: the first quarter is asked for when the warpgroup starts the tile's mainloop, each
// later one when the previous quarter's reads are done. The register path above waits a global
// round trip for every 8 column groups of a row pair (8 per tile); here the epilogue waits at most
// three TMA loads per tile, and H takes no registers while it is in flight. Math, stores and the
// score slots as in DSwiGLUEpilogue.
template <int kTileM, int kTileN>
struct DSwiGLUSmemSourceEpilogue : DSwiGLUColumns<kTileN> {
  static_assert(kTileM == 128 && kTileN == 256, "the cooperative 128 x 256 tiles: 64 rows per warpgroup");
  using Tile = EpilogueTile<kTileM, kTileN>;
  using Element = typename Tile::Element;
  using Columns = DSwiGLUColumns<kTileN>;
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
          dswiglu_groups(accum, v1, 0, j0, score[v1], g4, u4, dg4, du4, as4, d_score[v1]);
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
