// Mainloop of the sm90 varlen-K grouped GEMMs (the expert weight gradients K5 and K7):
// out[e] = sum over the sorted rows r of expert e of a_row(r)^T b_row(r), so the reduction runs
// along the expert's rows, whose number only the device knows.
//
// Both operands are row-major sources read along their rows (M, resp. N, contiguous), so in
// shared memory both are MN-major (WGMMA transposes them on the fly). One of them is gathered:
// its row r is src[gather_idx[r]] (dO for dW2, x for dW1), the other is read at row r (A' for
// dW2, dH for dW1). Hopper's TMA cannot gather, so the 128 producer threads copy the gathered
// operand with cp.async in 16-byte chunks, zero-filling rows past the expert's end and columns
// past the output's edge; each thread's copies arrive on the stage's barrier when they land.
// The other operand arrives either the same way or (kTmaDense) by TMA in boxes of 64 columns
// x 64 rows. TMA cannot stop at the expert's end: it loads the next expert's rows, which meet
// zero-filled rows of the gathered operand and add nothing, as long as they are finite. So
// kTmaDense is for buffers whose every row was written (top-K routing); token rounding's
// upper-bound buffers have unwritten rows past offsets[E] and take the cp.async path.
// With kClusterM = 2 (cooperative, kTmaDense) a 2 x 1 cluster runs the two m blocks of a pair
// (VarlenKTileScheduler), which read the same dense rows and columns: each CTA loads half of the
// dense boxes and multicasts them to both, a third less L2 traffic per tile. A stage is then
// written by both producers, so each consumer warp releases it in both CTAs, and a producer
// drains its ring before its CTA exits.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cute/arch/cluster_sm90.hpp"
#include "cute/arch/copy_sm90_tma.hpp"
#include "cute/atom/mma_traits_sm90_gmma.hpp"
#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/bfloat16.h"

#include "sm90/collective/wgmma_consumer_sm90.cuh"
#include "sm90/ptx.cuh"

namespace sonicmoe::sm90 {

template <int kTileM_, int kTileN_, int kTileK_, int kStages_, bool kGatherA_, bool kTmaDense_,
          int kConsumers_ = 1, int kClusterM_ = 1>
struct VarlenKMainloop {
  static constexpr int kTileM = kTileM_;
  static constexpr int kTileN = kTileN_;
  static constexpr int kTileK = kTileK_;  // rows of the sorted layout per stage
  static constexpr int kStages = kStages_;
  static constexpr bool kGatherA = kGatherA_;  // else B is the gathered operand
  static constexpr bool kTmaDense = kTmaDense_;  // the non-gathered operand by TMA
  static constexpr bool kCpAsyncProducer = true;
  // 1: ping-pong 128 x 128, a warpgroup owns a tile. 2: cooperative, both warpgroups on a tile
  // whose TMA (dense) side is 256 wide and whose gathered side stays 128 wide: 128 x 256 when
  // A is gathered, 256 x 128 when B is, so each gathered row chunk serves twice the FLOPs.
  static constexpr int kConsumers = kConsumers_;
  static constexpr int kClusterM = kClusterM_;  // CTAs sharing the dense operand by multicast
  static constexpr int kProducerThreads = 128;
  static constexpr int kBoxesB = 2;     // the epilogue's B box origins, unused here
  static constexpr int kBoxCols = 64;   // TMA box: 64 columns (one 128-byte swizzle row) ...
  static constexpr int kBoxRows = kTileK_;  // ... by one stage's rows
  static constexpr int kGatherCols = kGatherA ? kTileM : kTileN;  // the gathered operand's tile width
  static constexpr int kDenseCols = kGatherA ? kTileN : kTileM;
  static_assert(kConsumers == 1 ? (kTileM == 128 && kTileN == 128)
                                : (kConsumers == 2 && kTmaDense && kGatherCols == 128 && kDenseCols == 256),
                "ping-pong 128 x 128, or cooperative with a 128-wide gathered and a 256-wide TMA side");
  static_assert(kClusterM == 1 || (kClusterM == 2 && kConsumers == 2), "clusters on the cooperative tile");

  using Element = cutlass::bfloat16_t;
  // MN-major 64 x 8 swizzle atoms, k-atoms first (CUTLASS's order for MN-major operands).
  using SmemLayoutA = decltype(cute::tile_to_shape(
      cute::GMMA::Layout_MN_SW128_Atom<Element>{},
      cute::Shape<cute::Int<kTileM>, cute::Int<kTileK>, cute::Int<kStages>>{},
      cute::Step<cute::_2, cute::_1, cute::_3>{}));
  using SmemLayoutB = decltype(cute::tile_to_shape(
      cute::GMMA::Layout_MN_SW128_Atom<Element>{},
      cute::Shape<cute::Int<kTileN>, cute::Int<kTileK>, cute::Int<kStages>>{},
      cute::Step<cute::_2, cute::_1, cute::_3>{}));
  // One 64-row atom per warpgroup along M: ping-pong repeats it over 128 rows; cooperative
  // warpgroup w runs rows 64 w (and 64 w + 128 of a 256-row tile), N the whole tile.
  using MmaAtom = cute::conditional_t<
      kTileN == 256, cute::SM90_64x256x16_F32BF16BF16_SS<cute::GMMA::Major::MN, cute::GMMA::Major::MN>,
      cute::SM90_64x128x16_F32BF16BF16_SS<cute::GMMA::Major::MN, cute::GMMA::Major::MN>>;
  using TiledMma = decltype(cute::make_tiled_mma(
      MmaAtom{}, cute::Layout<cute::Shape<cute::Int<kConsumers>, cute::_1, cute::_1>>{}));

  // Full barrier arrivals per stage: one per copying thread, plus the TMA issuer's.
  static constexpr uint32_t kFullArrivals = kTmaDense ? 1 + kProducerThreads : kProducerThreads;
  // One per consumer warp of every CTA whose producer writes the stage (the whole cluster).
  static constexpr uint32_t kEmptyArrivals = 4 * kConsumers * kClusterM;
  static constexpr uint16_t kClusterMask = (1u << kClusterM) - 1;  // multicast to every CTA
  static constexpr uint32_t kBytesDense = kDenseCols * kTileK * sizeof(Element);

  using SharedStorage = StageBuffers<Element, SmemLayoutA, SmemLayoutB>;
  using Barriers = StageBarriers<kStages>;

  struct Params {
    CUtensorMap tma_dense;                // the non-gathered operand (m_total, cols), kTmaDense
    const Element* a = nullptr;           // (gathered ? num_tokens : m_total, m_out)
    const Element* b = nullptr;           // (gathered ? num_tokens : m_total, n_out)
    const int32_t* gather_idx = nullptr;  // sorted row -> token
    int gather_src_rows = 0;              // num_tokens: gather_idx must stay below it
    int m_out = 0;
    int n_out = 0;
  };

  // An expert without rows still takes one k step, of zero-filled stages, so its tiles store
  // exact zeros through the ordinary path (a separate zeroing branch made ptxas spill accum).
  template <class Tile>
  static __device__ int k_tiles(const Params&, const Tile& tile) {
    return max(1, (tile.k_rows + kTileK - 1) / kTileK);
  }

  static __device__ void init_barriers(Barriers& s) { s.init(kFullArrivals, kEmptyArrivals); }

  static __device__ void prefetch_descriptors(const Params& p) {
    if constexpr (kTmaDense) cute::prefetch_tma_descriptor(&p.tma_dense);
  }

  // Copy geometry: thread t copies 16-byte chunk t % 16 (8 columns) of sorted rows t / 16 + 8 j,
  // j < 8, of each copied operand (128 wide) in every stage.
  static constexpr int kChunks = 128 / 8;  // 16-byte chunks per row of a 128-wide operand
  static constexpr int kRowsPerPass = kProducerThreads / kChunks;
  static constexpr int kPasses = kTileK / kRowsPerPass;
  static_assert(kRowsPerPass == 8, "a pass fills one 8-row band of swizzle atoms");
  static constexpr uint32_t kPassBytes = 1024;  // one 64 x 8 atom: the next 8 rows, same XOR pattern

  // Byte offset in a stage of a 128-wide MN-major operand of chunk c (columns 8c..8c+7) of row
  // r < 8, as SmemLayoutA / B place it: 64 x 8 atoms of 1024 bytes, k-atoms first (kTileK / 8
  // of them per 64 columns), each row 128 bytes, and the 128-byte swizzle (byte address bits
  // [4, 7) ^= bits [7, 10)) puts chunk c % 8 of row r at chunk (c % 8) ^ r. Pass j adds j
  // atoms, which leaves bits [4, 10) alone. One offset per thread replaces per-copy swizzle
  // math on 64-bit pointers: the producer was issue-bound on it (ncu on K7: ~295
  // instructions per stage and warp, the consumers waiting on full stages 45% of the time).
  static constexpr uint32_t copy_offset(int r, int c) {
    return (c / 8) * (kTileK / 8) * 1024 + r * 128 + (((c % 8) ^ r) * 16);
  }

  // Producer side of one tile (all 128 producer threads).
  template <class Tile, class BoxRows>
  static __device__ void load(const Params& p, SharedStorage& s, Barriers& bar, const Tile& tile,
                              const BoxRows&, int& iteration, int thread_idx) {
    using namespace cute;
    constexpr uint32_t kStageBytesA = kTileM * kTileK * sizeof(Element);
    constexpr uint32_t kStageBytesB = kTileN * kTileK * sizeof(Element);
    const int chunk = thread_idx % kChunks;
    const int row0 = thread_idx / kChunks;  // row within a pass
    // Per operand, set once per tile: the 16-byte column chunk's address in row 0 (column
    // chunks past the output's edge point at column 0 and copy nothing), the row pitch in bytes
    // and the shared-memory destination in stage 0.
    const int col_a = tile.m_block * kTileM + chunk * 8, col_b = tile.n_block * kTileN + chunk * 8;
    const bool col_a_ok = col_a < p.m_out, col_b_ok = col_b < p.n_out;
    const char* src_a = reinterpret_cast<const char*>(p.a + (col_a_ok ? col_a : 0));
    const char* src_b = reinterpret_cast<const char*>(p.b + (col_b_ok ? col_b : 0));
    const uint32_t pitch_a = p.m_out * sizeof(Element), pitch_b = p.n_out * sizeof(Element);
    const uint32_t dst_a = cute::cast_smem_ptr_to_uint(s.a) + copy_offset(row0, chunk);
    const uint32_t dst_b = cute::cast_smem_ptr_to_uint(s.b) + copy_offset(row0, chunk);
    // The dense operand without TMA is read at sorted row k_start + row0 + 8 j of each step;
    // rows past the expert's end point at its column chunk in row 0 and copy nothing.
    const uint32_t dense_pitch = kGatherA ? pitch_b : pitch_a, gather_pitch = kGatherA ? pitch_a : pitch_b;
    const char* dense_col = kGatherA ? src_b : src_a;
    const char* dense = dense_col + int64_t(tile.k_start + row0) * dense_pitch;
    const bool dense_col_ok = kGatherA ? col_b_ok : col_a_ok;
    const char* gather_src = kGatherA ? src_a : src_b;
    const bool gather_col_ok = kGatherA ? col_a_ok : col_b_ok;
    const int32_t* idx = p.gather_idx + tile.k_start + row0;
    const int rank = kClusterM == 1 ? 0 : static_cast<int>(cute::block_rank_in_cluster());

    // The rows of a k step are gather_idx entries: load them one step ahead, so their latency
    // hides behind the previous step's copies (loaded in the step itself, each stage waited ~8
    // dependent L2 round trips: ncu showed the producer stalled on L1TEX at ~13% SM throughput).
    // Rows past the expert's end take token 0 and copy nothing.
    int tokens[kPasses], next_tokens[kPasses];
    auto load_tokens = [&](int kt, int (&out)[kPasses]) {
      const int rows_left = tile.k_rows - kt * kTileK - row0;
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kPasses; ++j) out[j] = j * kRowsPerPass < rows_left ? __ldg(idx + kt * kTileK + j * kRowsPerPass) : 0;
    };
    const int num_k_tiles = k_tiles(p, tile);
    load_tokens(0, tokens);
    for (int kt = 0; kt < num_k_tiles; ++kt, ++iteration) {
      const int stage = iteration % kStages;
      if (kt + 1 < num_k_tiles) load_tokens(kt + 1, next_tokens);
      const int rows_left = tile.k_rows - kt * kTileK - row0;
      bool bad = false;  // only the expert's rows are checked: the others hold a 0 never read
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kPasses; ++j)
        bad |= j * kRowsPerPass < rows_left && static_cast<uint32_t>(tokens[j]) >= static_cast<uint32_t>(p.gather_src_rows);
      if (bad) __trap();  // a token out of range; no printf: see the kernel
      cutlass::arch::ClusterBarrier::wait(&bar.empty[stage], ((iteration / kStages) & 1) ^ 1);
      if constexpr (kTmaDense) {
        if (thread_idx == 0) {
          constexpr uint64_t kCacheHint = static_cast<uint64_t>(TMA::CacheHintSm90::EVICT_NORMAL);
          cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&bar.full[stage], kBytesDense);
          Element* dense_smem = kGatherA ? s.b + stage * kTileN * kTileK : s.a + stage * kTileM * kTileK;
          const int col0 = kGatherA ? tile.n_block * kTileN : tile.m_block * kTileM;
          CUTLASS_PRAGMA_UNROLL
          for (int i = 0; i < kDenseCols / kBoxCols; ++i) {
            if constexpr (kClusterM == 1) {
              SM90_TMA_LOAD_2D::copy(&p.tma_dense, &bar.full[stage], kCacheHint, dense_smem + i * kBoxCols * kTileK,
                                     col0 + i * kBoxCols, tile.k_start + kt * kTileK);
            } else if (i % kClusterM == rank) {  // this CTA's share of the boxes, into both CTAs
              SM90_TMA_LOAD_MULTICAST_2D::copy(&p.tma_dense, &bar.full[stage], kClusterMask, kCacheHint,
                                               dense_smem + i * kBoxCols * kTileK, col0 + i * kBoxCols,
                                               tile.k_start + kt * kTileK);
            }
          }
        }
      }
      const uint32_t gather_dst = (kGatherA ? dst_a + stage * kStageBytesA : dst_b + stage * kStageBytesB);
      const uint32_t dense_dst = (kGatherA ? dst_b + stage * kStageBytesB : dst_a + stage * kStageBytesA);
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kPasses; ++j) {
        const bool row_ok = j * kRowsPerPass < rows_left;
        cp_async_16_zfill(gather_dst + j * kPassBytes,
                          gather_src + static_cast<uint64_t>(static_cast<uint32_t>(tokens[j])) * gather_pitch,
                          row_ok && gather_col_ok);
        if constexpr (!kTmaDense) {
          const char* row = dense + int64_t(kt * kTileK + j * kRowsPerPass) * dense_pitch;
          cp_async_16_zfill(dense_dst + j * kPassBytes, row_ok ? row : dense_col, row_ok && dense_col_ok);
        }
      }
      cutlass::arch::cpasync_barrier_arrive_noinc(&bar.full[stage]);
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kPasses; ++j) tokens[j] = next_tokens[j];
    }
  }

  // Waits for the producer's last copies (a thread must not exit with cp.async in flight).
  static __device__ void load_tail() { cp_async_wait_all(); }
  // In a cluster, waits for the peer's last releases (StageBarriers::wait_all_released).
  static __device__ void drain(Barriers& bar, int iteration) {
    if constexpr (kClusterM > 1) bar.wait_all_released(iteration);
  }

  template <class Accumulator, class Tile>
  static __device__ void mma(const Params& p, SharedStorage& s, Barriers& bar, Accumulator& accum,
                             const Tile& tile, int& iteration, int thread_idx_in_warpgroup) {
    consume_stages<TiledMma, SmemLayoutA, SmemLayoutB, kStages, /*cp_async_operand=*/true, kClusterM>(
        s.a, s.b, bar.full, bar.empty, accum, k_tiles(p, tile), iteration, thread_idx_in_warpgroup);
  }
};

}  // namespace sonicmoe::sm90
