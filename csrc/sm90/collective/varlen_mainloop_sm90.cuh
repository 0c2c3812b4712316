// Mainloop of the sm90 varlen-M grouped GEMMs: a producer that fills a ring of shared-memory
// stages and a consumer warpgroup that runs WGMMA over them.
//
// B (the expert weights) always arrives by TMA from one 3-D descriptor, in boxes of 64 of its N
// columns: either K-major, weights (E, N, k) with k contiguous (out = A @ W^T: K1, K2), or
// N-major, weights (E, k, N) with N contiguous (out = A @ W: the backward's dO @ w2 and dH @ w1). Each box's row origin comes from the epilogue
// policy, so the SwiGLU up-projection can put gate rows and the matching up rows of the public
// concatenated w1 into one tile without a weight copy.
// A (the activations) arrives either
//  - by TMA from one 2-D descriptor over the sorted rows (K2: contiguous A). A tile starts at
//    any row; rows past the expert's end are loaded but their results are never stored, and
//    rows past m_total are zero-filled by TMA; or
//  - by cp.async gather (K1: A row r is x[gather_idx[r]]), since Hopper's TMA cannot gather.
//    All 128 producer threads copy 16-byte chunks into the same 128B-swizzled layout TMA
//    writes; each thread's copies arrive on the stage's barrier when they land.
// With kClusterM = 2 the two CTAs of a 2 x 1 cluster run a pair of consecutive tiles
// (varlen_tile_scheduler.cuh). Where both need the same B (shares_b: one expert and n block),
// each loads half of B's boxes and multicasts them to both, halving B's L2 reads; otherwise each
// loads its own. A stage of either CTA is then written by both
// producers, so each consumer warp releases it in both CTAs (kEmptyArrivals), and a producer
// drains its ring before its CTA exits (drain).
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

template <int kTileM_, int kTileN_, int kTileK_, int kStages_, bool kGatherA_, bool kKMajorB_ = true,
          int kConsumers_ = 1, int kClusterM_ = 1>
struct VarlenMainloop {
  static constexpr int kTileM = kTileM_;
  static constexpr int kTileN = kTileN_;
  static constexpr int kTileK = kTileK_;
  static constexpr int kStages = kStages_;
  static constexpr bool kGatherA = kGatherA_;
  static constexpr bool kCpAsyncProducer = kGatherA;  // producer threads copy (register budget)
  static constexpr bool kKMajorB = kKMajorB_;
  static constexpr int kBoxRowsB = 64;  // rows of one B TMA box (one swizzle-aligned half tile)
  static constexpr int kBoxesB = kTileN / kBoxRowsB;
  static constexpr int kProducerThreads = 128;
  // Consumer warpgroups per tile: 1, ping-pong (each warpgroup owns a 128 x 128 tile, the other
  // one's epilogue overlapping its MMA); 2, cooperative (both on one tile, kTileM / 2 rows
  // each: 256 x 128, a quarter less L2 traffic per FLOP than two ping-pong tiles, or 128 x 256,
  // where a gathered A row also serves twice the output columns).
  static constexpr int kConsumers = kConsumers_;
  static constexpr int kClusterM = kClusterM_;  // CTAs sharing B by multicast (1 or 2)
  static constexpr int kWarpgroupRows = kTileM / kConsumers;
  static_assert(kConsumers == 1 || kConsumers == 2, "ping-pong or cooperative");
  static_assert(kWarpgroupRows % 64 == 0 && kWarpgroupRows * kTileN <= 128 * 192,
                "64-row WGMMA blocks; at most 192 fp32 accumulators per consumer thread");
  static_assert(kTileK == 64, "one 128-byte swizzle row per tile row (bf16)");
  static_assert(kTileN % kBoxRowsB == 0 && kTileM % 64 == 0, "tile sizes");
  static_assert(kClusterM == 1 || (kClusterM == 2 && kBoxesB % 2 == 0), "B's boxes split over the cluster");

  using Element = cutlass::bfloat16_t;
  using SmemLayoutA = decltype(cute::tile_to_shape(
      cute::GMMA::Layout_K_SW128_Atom<Element>{},
      cute::Shape<cute::Int<kTileM>, cute::Int<kTileK>, cute::Int<kStages>>{}));
  // N-major B: 64 (N) x 8 (k) swizzle atoms, k-atoms first, so each 64-column half of the tile
  // is one contiguous 8 KB block, exactly what one TMA box of 64 columns x 64 k rows writes.
  using SmemLayoutB = cute::conditional_t<
      kKMajorB,
      decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<Element>{},
                                   cute::Shape<cute::Int<kTileN>, cute::Int<kTileK>, cute::Int<kStages>>{})),
      decltype(cute::tile_to_shape(cute::GMMA::Layout_MN_SW128_Atom<Element>{},
                                   cute::Shape<cute::Int<kTileN>, cute::Int<kTileK>, cute::Int<kStages>>{},
                                   cute::Step<cute::_2, cute::_1, cute::_3>{}))>;
  // One 64 x kTileN WGMMA atom per warpgroup, laid out along M: a ping-pong warpgroup repeats
  // it over its 128 rows, cooperative warpgroup w runs rows 64 w (and 64 w + 128 in a 256-row
  // tile); the epilogue finds its rows from the MMA coordinates.
  static constexpr auto kMajorB = kKMajorB ? cute::GMMA::Major::K : cute::GMMA::Major::MN;
  using MmaAtom = cute::conditional_t<
      kTileN == 256, cute::SM90_64x256x16_F32BF16BF16_SS<cute::GMMA::Major::K, kMajorB>,
      cute::conditional_t<kTileN == 192, cute::SM90_64x192x16_F32BF16BF16_SS<cute::GMMA::Major::K, kMajorB>,
                          cute::SM90_64x128x16_F32BF16BF16_SS<cute::GMMA::Major::K, kMajorB>>>;
  static_assert(kTileN == 128 || kTileN == 192 || kTileN == 256, "64x128, 64x192 or 64x256 MMA atoms");
  using TiledMma = decltype(cute::make_tiled_mma(
      MmaAtom{}, cute::Layout<cute::Shape<cute::Int<kConsumers>, cute::_1, cute::_1>>{}));

  static constexpr uint32_t kBytesA = kTileM * kTileK * sizeof(Element);
  static constexpr uint16_t kClusterMask = (1u << kClusterM) - 1;  // multicast to every CTA
  static constexpr uint32_t kBytesB = kTileN * kTileK * sizeof(Element);
  // Full barrier arrivals per stage: the TMA issuer, plus one per gathering thread.
  static constexpr uint32_t kFullArrivals = kGatherA ? 1 + kProducerThreads : 1;
  // Empty barrier arrivals per stage: one per warp of the consuming warpgroup(s), of every CTA
  // whose producer writes the stage (the whole cluster).
  static constexpr uint32_t kEmptyArrivals = 4 * kConsumers * kClusterM;

  using SharedStorage = StageBuffers<Element, SmemLayoutA, SmemLayoutB>;
  using Barriers = StageBarriers<kStages>;

  struct Params {
    CUtensorMap tma_a;  // (k, m_total) over the sorted rows; unused when gathering
    CUtensorMap tma_b;  // (k, N, E) over K-major weights, (N, k, E) over N-major ones
    const Element* gather_src = nullptr;       // x, (num_tokens, k), when gathering
    const int32_t* gather_idx = nullptr;       // sorted row -> token, when gathering
    int gather_src_rows = 0;                   // num_tokens: gather_idx must stay below it
    int k = 0;
  };

  template <class Tile>
  static __device__ int k_tiles(const Params& p, const Tile&) { return (p.k + kTileK - 1) / kTileK; }

  static __device__ void init_barriers(Barriers& s) { s.init(kFullArrivals, kEmptyArrivals); }

  static __device__ void prefetch_descriptors(const Params& p) {
    if constexpr (!kGatherA) cute::prefetch_tma_descriptor(&p.tma_a);
    cute::prefetch_tma_descriptor(&p.tma_b);
  }

  // Gather geometry: thread t copies 16-byte chunk t % 8 of rows t / 8 + 16 j, j < kPasses.
  static constexpr int kChunksPerRow = kTileK * sizeof(Element) / 16;
  static constexpr int kRowsPerPass = kProducerThreads / kChunksPerRow;
  static constexpr int kPasses = kTileM / kRowsPerPass;
  static constexpr uint32_t kPassBytes = kRowsPerPass * kTileK * sizeof(Element);

  // Byte offset in a stage of a thread's first chunk (row r, chunk c), as the 128-byte swizzle
  // of SmemLayoutA places it (the hardware pattern: within each 1024-byte atom of 8 rows, byte
  // address bits [4, 7) ^= bits [7, 10)), so chunk c of row r sits at chunk c ^ (r % 8). The
  // up_proj and down_proj_grad GPU tests check it end to end. A pass moves 16 rows,
  // two whole atoms, so later passes sit kPassBytes further on with the same XOR pattern:
  // one offset per thread replaces per-copy swizzle math (the producer was issue-bound on it).
  static constexpr uint32_t gather_offset(int r, int c) {
    return (r / 8) * 1024 + (r % 8) * 128 + ((c ^ (r % 8)) * 16);
  }

  // Producer side of one tile. `iteration` counts k steps over all tiles of this CTA (the
  // ring position); `b_rows[i]` is the weight row where B box i of this tile starts.
  // Called by all kProducerThreads threads (thread_idx in [0, 128)).
  template <class Tile>
  static __device__ void load(const Params& p, SharedStorage& s, Barriers& bar, const Tile& tile,
                              const cute::array<int, kBoxesB>& b_rows, int& iteration, int thread_idx) {
    using namespace cute;
    constexpr uint64_t kCacheHint = static_cast<uint64_t>(TMA::CacheHintSm90::EVICT_NORMAL);
    const bool tma_issuer = thread_idx == 0;
    if (!kGatherA && !tma_issuer) return;
    const int rank = kClusterM == 1 ? 0 : static_cast<int>(cute::block_rank_in_cluster());

    // Gather: one source pointer per pass, set once per tile. Rows past the tile's rows copy the
    // tile's first row instead (valid wherever the tile has a row); their results are never
    // stored, and no copy needs a row predicate. A cluster pair's empty half (rows = 0) reads
    // nothing: its stages are zero-filled.
    const int chunk = thread_idx % kChunksPerRow;
    const bool has_rows = kClusterM == 1 || tile.rows > 0;  // only a cluster pair's half has none
    const Element* src[kGatherA ? kPasses : 1];
    uint32_t dst = 0;
    if constexpr (kGatherA) {
      const int row0 = thread_idx / kChunksPerRow;
      dst = cute::cast_smem_ptr_to_uint(s.a) + gather_offset(row0, chunk);
      const int first = has_rows ? __ldg(p.gather_idx + tile.row_start) : 0;
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kPasses; ++j) {
        const int r = row0 + j * kRowsPerPass;
        const int token = r < tile.rows ? __ldg(p.gather_idx + tile.row_start + r) : first;
        if (has_rows && (token < 0 || token >= p.gather_src_rows)) __trap();  // no printf: see the kernel
        src[j] = p.gather_src + int64_t(token) * p.k + chunk * 8;
      }
    }

    const int num_k_tiles = k_tiles(p, tile);
    for (int kt = 0; kt < num_k_tiles; ++kt, ++iteration) {
      const int stage = iteration % kStages;
      const uint32_t phase = (iteration / kStages) & 1;
      cutlass::arch::ClusterBarrier::wait(&bar.empty[stage], phase ^ 1);
      const int k0 = kt * kTileK;
      if (tma_issuer) {
        cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(
            &bar.full[stage], kGatherA ? kBytesB : kBytesA + kBytesB);
        if constexpr (!kGatherA) {
          SM90_TMA_LOAD_2D::copy(&p.tma_a, &bar.full[stage], kCacheHint,
                                 s.a + stage * kTileM * kTileK, k0, tile.row_start);
        }
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < kBoxesB; ++i) {
          Element* box = s.b + stage * kTileN * kTileK + i * kBoxRowsB * kTileK;
          const int c0 = kKMajorB ? k0 : b_rows[i], c1 = kKMajorB ? b_rows[i] : k0;
          if (kClusterM == 1 || !tile.shares_b) {  // without a cluster, or a pair needing two Bs
            SM90_TMA_LOAD_3D::copy(&p.tma_b, &bar.full[stage], kCacheHint, box, c0, c1, tile.expert);
          } else if (i % kClusterM == rank) {  // this CTA's half of the boxes, into both CTAs
            SM90_TMA_LOAD_MULTICAST_3D::copy(&p.tma_b, &bar.full[stage], kClusterMask, kCacheHint, box, c0, c1,
                                             tile.expert);
          }
        }
      }
      if constexpr (kGatherA) {
        // Columns past k (a partial last step) are zero-filled; nothing is read for them.
        const bool col_ok = has_rows && k0 + chunk * 8 < p.k;
        const int step = col_ok ? k0 : 0;
        const uint32_t stage_dst = dst + stage * kBytesA;
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < kPasses; ++j) cp_async_16_zfill(stage_dst + j * kPassBytes, src[j] + step, col_ok);
        cutlass::arch::cpasync_barrier_arrive_noinc(&bar.full[stage]);
      }
    }
  }

  // Waits for the producer's last copies (a thread must not exit with cp.async in flight).
  static __device__ void load_tail() {
    if constexpr (kGatherA) cp_async_wait_all();
  }

  // In a cluster, waits for the peer's last releases (StageBarriers::wait_all_released).
  static __device__ void drain(Barriers& bar, int iteration) {
    if constexpr (kClusterM > 1) bar.wait_all_released(iteration);
  }

  // Consumer side of one tile: accum = A_tile @ B_tile^T over all k steps (wgmma_consumer_sm90.cuh).
  // Called by the tile's consumer warpgroups (thread index within them).
  template <class Accumulator, class Tile>
  static __device__ void mma(const Params& p, SharedStorage& s, Barriers& bar, Accumulator& accum,
                             const Tile& tile, int& iteration, int mma_thread_idx) {
    consume_stages<TiledMma, SmemLayoutA, SmemLayoutB, kStages, /*cp_async_operand=*/kGatherA, kClusterM>(
        s.a, s.b, bar.full, bar.empty, accum, k_tiles(p, tile), iteration, mma_thread_idx);
  }

};

}  // namespace sonicmoe::sm90
