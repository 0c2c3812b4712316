// Mainloop of the sm100 varlen-K grouped GEMMs (the expert weight gradients K5 and K7):
// out[e] = sum over the sorted rows r of expert e of a_row(r)^T b_row(r), the reduction along the
// expert's rows, whose number only the device knows (VarlenKTileScheduler's k_start, k_rows).
//
// A is the gathered operand, 128 wide (M: one TMEM lane per output row of the tile), B the dense
// one, 256 wide (N, the widest 1-SM tcgen05 N); K7 runs as the transposed problem so that its
// gathered x is A too (weight_grad_launch_sm100.cuh). Both sources are row-major (rows, cols), read
// along their rows, so both operands are MN-major in shared memory: 64 (MN) x 8 (k) swizzle atoms,
// k first, each 64-column block of a stage one 8 KB block of 64 sorted rows of 128 bytes.
//  - A by cp.async: row r of a step is gather_src[gather_idx[r]]; the 128 producer threads copy
//    16-byte chunks into the swizzled layout by hand (copy_offset), zero-filling rows past the
//    expert's end and columns past m_out; each thread's copies arrive on the stage's full barrier
//    when they land (cp.async.mbarrier.arrive.noinc). Bad indices trap, as on sm90.
//  - B (kTmaDense) by TMA: 2-D boxes of 64 columns x 64 sorted rows over (m_total, n_out). TMA
//    cannot stop at the expert's end: the next expert's rows meet A's zero-filled rows and add
//    nothing as long as they are finite, so this is for buffers whose rows are written up to a box
//    past offsets[E]. Otherwise (!kTmaDense: partial_rows without rows_past_end_zeroed, or no rows
//    at all, which no TMA descriptor can describe) the same producer threads copy B by cp.async
//    too, zero-filling past the expert's end.
//  - One MMA warp: 4 tcgen05.mma (128 x 256 x 16, 1 SM, both operands MN-major) per stage
//    (umma_stages_sm100.cuh).
// An expert without rows still takes one zero-filled k step, so its tiles store exact zeros through
// the ordinary path.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cute/arch/copy_sm90_tma.hpp"
#include "cute/atom/mma_traits_sm100.hpp"
#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/bfloat16.h"

#include "common/ptx.cuh"
#include "common/varlen_tile_scheduler.cuh"
#include "sm100/collective/umma_stages_sm100.cuh"

namespace sonicmoe::sm100 {

template <int kTileM_, int kTileN_, int kTileK_, int kStages_, bool kTmaDense_>
struct VarlenKMainloop {
  static constexpr int kTileM = kTileM_;  // gathered columns (A)
  static constexpr int kTileN = kTileN_;  // dense columns (B)
  static constexpr int kTileK = kTileK_;  // sorted rows per stage
  static constexpr int kStages = kStages_;
  static constexpr bool kTmaDense = kTmaDense_;
  static constexpr int kBoxCols = 64;  // TMA box: 64 columns (one 128-byte swizzle row) x kTileK rows
  static constexpr int kBoxesB = kTileN / kBoxCols;
  static constexpr int kGatherThreads = 128;
  static_assert(kTileM == 128 && kTileN == 256, "1-SM MMA, M = 128 (one TMEM lane per row), N = 256");
  static_assert(kTileK == 64, "8 swizzle atoms of 8 rows per 64-column block");

  using Element = cutlass::bfloat16_t;
  using TiledMma = decltype(cute::make_tiled_mma(
      cute::SM100_MMA_F16BF16_SS<Element, Element, float, kTileM, kTileN, cute::UMMA::Major::MN,
                                 cute::UMMA::Major::MN>{}));
  using MmaShapeA = decltype(cute::partition_shape_A(
      TiledMma{}, cute::make_shape(cute::Int<kTileM>{}, cute::Int<kTileK>{})));
  using MmaShapeB = decltype(cute::partition_shape_B(
      TiledMma{}, cute::make_shape(cute::Int<kTileN>{}, cute::Int<kTileK>{})));
  // k-first: each 64-column block of a stage is the 8 KB one TMA box of 64 columns x 64 rows writes.
  using SmemLayoutA = decltype(cute::UMMA::tile_to_mma_shape(cute::UMMA::Layout_MN_SW128_Atom<Element>{},
                                                             cute::append(MmaShapeA{}, cute::Int<kStages>{}),
                                                             cute::Step<cute::_2, cute::_1, cute::_3>{}));
  using SmemLayoutB = decltype(cute::UMMA::tile_to_mma_shape(cute::UMMA::Layout_MN_SW128_Atom<Element>{},
                                                             cute::append(MmaShapeB{}, cute::Int<kStages>{}),
                                                             cute::Step<cute::_2, cute::_1, cute::_3>{}));

  static constexpr uint32_t kBytesA = kTileM * kTileK * sizeof(Element);
  static constexpr uint32_t kBytesB = kTileN * kTileK * sizeof(Element);
  // Each copying thread, and the TMA issuer where B comes by TMA.
  static constexpr uint32_t kFullArrivals = kTmaDense ? 1 + kGatherThreads : kGatherThreads;
  static constexpr uint32_t kEmptyArrivals = 1;  // the MMA warp's commit

  using SharedStorage = StageRing<Element, SmemLayoutA, SmemLayoutB, kStages>;

  struct Params {
    CUtensorMap tma_b;                    // dense (m_total, n_out) in 64 x 64 boxes, kTmaDense
    const Element* gather_src = nullptr;  // (num_tokens, m_out)
    const int32_t* gather_idx = nullptr;  // sorted row -> token
    const Element* dense = nullptr;       // (m_total, n_out), read by cp.async where !kTmaDense
    int gather_src_rows = 0;              // num_tokens: gather_idx must stay below it
    int m_out = 0;
    int n_out = 0;
  };

  static __device__ int k_tiles(const VarlenTile& tile) { return max(1, (tile.k_rows + kTileK - 1) / kTileK); }

  static __device__ void init(SharedStorage& s) { s.init(kFullArrivals, kEmptyArrivals); }

  static __device__ void prefetch_descriptors(const Params& p) {
    if constexpr (kTmaDense) cute::prefetch_tma_descriptor(&p.tma_b);
  }

  // Copy geometry: thread t copies 16-byte chunk t % 16 (columns 8 (t % 16) ..) of sorted rows
  // t / 16 + 8 j, j < 8, of A, and (!kTmaDense) chunks t % 16 + 16 h, h < 2, of the same rows of B.
  static constexpr int kChunks = kTileM * sizeof(Element) / 16;  // 16-byte chunks per row of A
  static constexpr int kRowsPerPass = kGatherThreads / kChunks;
  static constexpr int kPasses = kTileK / kRowsPerPass;
  static constexpr int kDenseHalves = kTileN / kTileM;
  static_assert(kRowsPerPass == 8, "a pass fills one 8-row band of swizzle atoms");
  static constexpr uint32_t kPassBytes = 1024;  // one 64 x 8 atom: the next 8 rows, same XOR pattern

  // Byte offset in a stage of chunk c (columns 8c .. 8c + 7) of sorted row r < 8, as SmemLayoutA /
  // SmemLayoutB place it: 64-column blocks of kTileK / 8 atoms of 1024 bytes, rows of 128 bytes,
  // and the 128-byte swizzle puts chunk c % 8 of row r at chunk (c % 8) ^ r. Pass j adds j atoms.
  static constexpr uint32_t copy_offset(int r, int c) {
    return (c / 8) * (kTileK / 8) * 1024 + r * 128 + (((c % 8) ^ r) * 16);
  }
  // copy_offset(0, kChunks): where B's columns 128 .. 255 start in a stage.
  static constexpr uint32_t kHalfBytesB = (kChunks / 8) * (kTileK / 8) * 1024;

  // The copying producers' side of one tile (thread_idx in [0, kGatherThreads)).
  static __device__ void load_a(const Params& p, SharedStorage& s, const VarlenTile& tile, int& iteration,
                                int thread_idx) {
    const int chunk = thread_idx % kChunks;
    const int row0 = thread_idx / kChunks;  // row within a pass
    // Set once per tile: the chunk's address in row 0 (chunks past the output's edge point at
    // column 0 and copy nothing), the row pitch in bytes, the destination in stage 0.
    const int col_a = tile.m_block * kTileM + chunk * 8;
    const bool col_a_ok = col_a < p.m_out;
    const char* src_a = reinterpret_cast<const char*>(p.gather_src + (col_a_ok ? col_a : 0));
    const uint32_t pitch_a = p.m_out * sizeof(Element), pitch_b = p.n_out * sizeof(Element);
    const uint32_t dst_a = cute::cast_smem_ptr_to_uint(s.a) + copy_offset(row0, chunk);
    const uint32_t dst_b = cute::cast_smem_ptr_to_uint(s.b) + copy_offset(row0, chunk);
    const int32_t* idx = p.gather_idx + tile.k_start + row0;
    const int col_b = tile.n_block * kTileN + chunk * 8;
    // !kTmaDense: B at sorted row k_start + row0 of the step's first pass.
    const char* dense = reinterpret_cast<const char*>(p.dense + int64_t(tile.k_start + row0) * p.n_out + col_b);

    // The rows of a k step are gather_idx entries: load them one step ahead, so their latency
    // hides behind the previous step's copies (sm90's K5 / K7 measured it). Rows past the expert's
    // end take token 0 and copy nothing.
    int tokens[kPasses], next_tokens[kPasses];
    auto load_tokens = [&](int kt, int (&out)[kPasses]) {
      const int rows_left = tile.k_rows - kt * kTileK - row0;
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kPasses; ++j)
        out[j] = j * kRowsPerPass < rows_left ? __ldg(idx + kt * kTileK + j * kRowsPerPass) : 0;
    };
    const int num_k_tiles = k_tiles(tile);
    load_tokens(0, tokens);
    for (int kt = 0; kt < num_k_tiles; ++kt, ++iteration) {
      if (kt + 1 < num_k_tiles) load_tokens(kt + 1, next_tokens);
      const int rows_left = tile.k_rows - kt * kTileK - row0;
      bool bad = false;  // only the expert's rows are checked: the others hold a 0 never read
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kPasses; ++j)
        bad |= j * kRowsPerPass < rows_left &&
               static_cast<uint32_t>(tokens[j]) >= static_cast<uint32_t>(p.gather_src_rows);
      if (bad) __trap();  // a token out of range; no printf (a call in a kernel costs registers)
      const int stage = s.wait_empty(iteration);
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kPasses; ++j) {
        const bool row_ok = j * kRowsPerPass < rows_left;
        cp_async_16_zfill(dst_a + stage * kBytesA + j * kPassBytes,
                          src_a + static_cast<uint64_t>(static_cast<uint32_t>(tokens[j])) * pitch_a,
                          row_ok && col_a_ok);
        if constexpr (!kTmaDense) {
          const char* row = dense + int64_t(kt * kTileK + j * kRowsPerPass) * pitch_b;
          CUTLASS_PRAGMA_UNROLL
          for (int h = 0; h < kDenseHalves; ++h) {
            const bool ok = row_ok && col_b + h * kTileM < p.n_out;
            cp_async_16_zfill(dst_b + stage * kBytesB + j * kPassBytes + h * kHalfBytesB,
                              ok ? row + h * kTileM * sizeof(Element) : src_a, ok);
          }
        }
      }
      cutlass::arch::cpasync_barrier_arrive_noinc(&s.full[stage]);
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kPasses; ++j) tokens[j] = next_tokens[j];
    }
  }

  // The TMA producer's side of one tile (one thread): B's boxes at columns b_cols, rows from the
  // expert's first sorted row. Nothing where B is copied by the producer threads.
  static __device__ void load_b(const Params& p, SharedStorage& s, const VarlenTile& tile,
                                const cute::array<int, kBoxesB>& b_cols, int& iteration) {
    if constexpr (kTmaDense) {
      constexpr uint64_t kCacheHint = static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_NORMAL);
      const int num_k_tiles = k_tiles(tile);
      for (int kt = 0; kt < num_k_tiles; ++kt, ++iteration) {
        const int stage = s.wait_empty_expect_tx(iteration, kBytesB);
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < kBoxesB; ++i) {
          Element* box = s.b + stage * kTileN * kTileK + i * kBoxCols * kTileK;
          cute::SM90_TMA_LOAD_2D::copy(&p.tma_b, &s.full[stage], kCacheHint, box, b_cols[i],
                                       tile.k_start + kt * kTileK);
        }
      }
    }
  }

  // The MMA warp's side of one tile: accumulator (TMEM columns [tmem_acc, tmem_acc + kTileN)) =
  // the sum over the expert's rows of a_row^T b_row.
  static __device__ void mma(const Params&, SharedStorage& s, const VarlenTile& tile, uint32_t tmem_acc,
                             int& iteration) {
    mma_stages<TiledMma, SmemLayoutA, SmemLayoutB, kTileM, kTileN, kStages>(s.a, s.b, s.full, s.empty, tmem_acc,
                                                                             k_tiles(tile), iteration);
  }
};

}  // namespace sonicmoe::sm100
