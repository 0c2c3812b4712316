// Mainloop of the sm100 varlen-M gathered GEMMs (K1, K4): a ring of shared-memory stages filled by two
// producers and drained by tcgen05 MMAs into an fp32 accumulator in tensor memory (TMEM).
//
//  - A (x rows gathered through gather_idx) by cp.async: Blackwell's TMA has a 4-row gather
//    (gather4) but CUTLASS 4.2 has no C++ for it. 128 producer threads copy 16-byte chunks into
//    the 128-byte-swizzled K-major layout the MMA reads; each thread's copies arrive on the stage's
//    full barrier when they land (cp.async.mbarrier.arrive.noinc). Rows past the tile's rows and
//    columns past k are zero-filled: nothing outside x is read.
//  - B by TMA from one 3-D descriptor, in boxes of 64 N rows whose origins the epilogue gives
//    (b_rows): K1's w1[e], K-major (E, 2n, d) (the gate rows of the tile and the matching up rows);
//    K4's w2[e], (E, d, n) with the reduction over d, so N-major (kKMajorB = false: 64 N columns
//    x kTileK k rows per box, read by an MN-major UMMA descriptor, as sm90's K4 reads it).
//  - One MMA warp: per stage, 4 tcgen05.mma (128 x kTileN x 16, 1 SM) issued by one thread; a
//    tcgen05.commit releases the stage when they have read it (umma_stages_sm100.cuh), another one
//    hands the finished accumulator to the epilogue.
// Stage barriers: full[s] completes with the TMA bytes and 128 cp.async arrivals; empty[s] with the
// MMA's commit (the CUTLASS PipelineUmmaConsumerAsync protocol, written out).
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

template <int kTileM_, int kTileN_, int kTileK_, int kStages_, bool kKMajorB_ = true>
struct VarlenGatherMainloop {
  static constexpr int kTileM = kTileM_;
  static constexpr int kTileN = kTileN_;
  static constexpr int kTileK = kTileK_;
  static constexpr int kStages = kStages_;
  static constexpr bool kKMajorB = kKMajorB_;  // make_weight_tensor_map's box order (common/tensor_map.h)
  static constexpr int kBoxRowsB = 64;    // rows of one B TMA box
  static constexpr int kBoxesB = kTileN / kBoxRowsB;
  static constexpr int kGatherThreads = 128;
  static_assert(kTileM == 128, "one TMEM lane per tile row (1-SM MMA, M = 128)");
  static_assert(kTileN % 16 == 0 && kTileN <= 256 && kTileN % kBoxRowsB == 0, "tcgen05 N; whole B boxes");
  static_assert(kTileK == 64, "one 128-byte swizzle row per tile row (bf16)");

  using Element = cutlass::bfloat16_t;
  static constexpr auto kMajorB = kKMajorB ? cute::UMMA::Major::K : cute::UMMA::Major::MN;
  using TiledMma = decltype(cute::make_tiled_mma(
      cute::SM100_MMA_F16BF16_SS<Element, Element, float, kTileM, kTileN, cute::UMMA::Major::K, kMajorB>{}));
  using MmaShapeA = decltype(cute::partition_shape_A(
      TiledMma{}, cute::make_shape(cute::Int<kTileM>{}, cute::Int<kTileK>{})));
  using MmaShapeB = decltype(cute::partition_shape_B(
      TiledMma{}, cute::make_shape(cute::Int<kTileN>{}, cute::Int<kTileK>{})));
  using SmemLayoutA = decltype(cute::UMMA::tile_to_mma_shape(
      cute::UMMA::Layout_K_SW128_Atom<Element>{}, cute::append(MmaShapeA{}, cute::Int<kStages>{})));
  // N-major B: 64 (N) x 8 (k) swizzle atoms, k first, so each 64-column block of a stage is one
  // contiguous 8 KB block, exactly what one TMA box of 64 N columns x 64 k rows writes (CUTLASS's
  // sm100 collectives order an MN-major B the same way).
  using SmemLayoutB = cute::conditional_t<
      kKMajorB,
      decltype(cute::UMMA::tile_to_mma_shape(cute::UMMA::Layout_K_SW128_Atom<Element>{},
                                             cute::append(MmaShapeB{}, cute::Int<kStages>{}))),
      decltype(cute::UMMA::tile_to_mma_shape(cute::UMMA::Layout_MN_SW128_Atom<Element>{},
                                             cute::append(MmaShapeB{}, cute::Int<kStages>{}),
                                             cute::Step<cute::_2, cute::_1, cute::_3>{}))>;

  static constexpr uint32_t kBytesA = kTileM * kTileK * sizeof(Element);
  static constexpr uint32_t kBytesB = kTileN * kTileK * sizeof(Element);
  static constexpr uint32_t kFullArrivals = 1 + kGatherThreads;  // the TMA issuer, each gathering thread
  static constexpr uint32_t kEmptyArrivals = 1;                   // the MMA warp's commit

  using SharedStorage = StageRing<Element, SmemLayoutA, SmemLayoutB, kStages>;

  struct Params {
    CUtensorMap tma_b;                    // (k, N, E) over K-major weights, (N, k, E) over N-major ones
    const Element* gather_src = nullptr;  // x, (num_tokens, k)
    const int32_t* gather_idx = nullptr;  // sorted row -> token
    int gather_src_rows = 0;              // num_tokens: gather_idx must stay below it
    int k = 0;
  };

  static __device__ int k_tiles(const Params& p) { return (p.k + kTileK - 1) / kTileK; }

  static __device__ void prefetch_descriptors(const Params& p) { cute::prefetch_tma_descriptor(&p.tma_b); }

  static __device__ void init(SharedStorage& s) { s.init(kFullArrivals, kEmptyArrivals); }

  // Gather geometry: thread t copies 16-byte chunk t % 8 of rows t / 8 + 16 j, j < kPasses.
  static constexpr int kChunksPerRow = kTileK * sizeof(Element) / 16;
  static constexpr int kRowsPerPass = kGatherThreads / kChunksPerRow;
  static constexpr int kPasses = kTileM / kRowsPerPass;
  static constexpr uint32_t kPassBytes = kRowsPerPass * kTileK * sizeof(Element);

  // Byte offset in a stage of row r's 16-byte chunk c: SmemLayoutA's rows are 128 bytes, one after
  // the other (8-row swizzle atoms along M), and the 128-byte swizzle moves chunk c to c ^ (r % 8).
  // A pass moves 16 rows (two whole atoms), so pass j sits j * kPassBytes further on.
  static constexpr uint32_t gather_offset(int r, int c) { return r * 128 + ((c ^ (r % 8)) * 16); }

  // The gathering producers' side of one tile (thread_idx in [0, kGatherThreads)). `iteration`
  // counts this CTA's k steps over all its tiles: the position in the ring.
  static __device__ void load_a(const Params& p, SharedStorage& s, const VarlenTile& tile, int& iteration,
                                int thread_idx) {
    const int chunk = thread_idx % kChunksPerRow;
    const int row0 = thread_idx / kChunksPerRow;
    const uint32_t dst = cute::cast_smem_ptr_to_uint(s.a) + gather_offset(row0, chunk);
    // One source pointer per pass, set once per tile; rows past the tile's are zero-filled.
    const Element* src[kPasses];
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kPasses; ++j) {
      const int r = row0 + j * kRowsPerPass;
      const int token = r < tile.rows ? __ldg(p.gather_idx + tile.row_start + r) : -1;
      if (token >= p.gather_src_rows || (r < tile.rows && token < 0)) __trap();  // a bad index: no printf
      src[j] = token < 0 ? nullptr : p.gather_src + int64_t(token) * p.k + chunk * 8;
    }
    const int num_k_tiles = k_tiles(p);
    for (int kt = 0; kt < num_k_tiles; ++kt, ++iteration) {
      const int stage = s.wait_empty(iteration);
      const int k0 = kt * kTileK;
      const bool col_ok = k0 + chunk * 8 < p.k;  // a partial last step: zeros past k
      const uint32_t stage_dst = dst + stage * kBytesA;
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kPasses; ++j) {
        const bool ok = col_ok && src[j] != nullptr;
        cp_async_16_zfill(stage_dst + j * kPassBytes, ok ? src[j] + k0 : p.gather_src, ok);
      }
      cutlass::arch::cpasync_barrier_arrive_noinc(&s.full[stage]);
    }
  }

  // The TMA producer's side of one tile (one thread): B's boxes at the weight rows (N) b_rows.
  static __device__ void load_b(const Params& p, SharedStorage& s, const VarlenTile& tile,
                                const cute::array<int, kBoxesB>& b_rows, int& iteration) {
    constexpr uint64_t kCacheHint = static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_NORMAL);
    const int num_k_tiles = k_tiles(p);
    for (int kt = 0; kt < num_k_tiles; ++kt, ++iteration) {
      const int stage = s.wait_empty_expect_tx(iteration, kBytesB);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kBoxesB; ++i) {
        Element* box = s.b + stage * kTileN * kTileK + i * kBoxRowsB * kTileK;
        const int k0 = kt * kTileK;
        const int c0 = kKMajorB ? k0 : b_rows[i], c1 = kKMajorB ? b_rows[i] : k0;
        cute::SM90_TMA_LOAD_3D::copy(&p.tma_b, &s.full[stage], kCacheHint, box, c0, c1, tile.expert);
      }
    }
  }

  // The MMA warp's side of one tile: accumulator (TMEM columns [tmem_acc, tmem_acc + kTileN)) =
  // A_tile @ B_tile^T over k.
  static __device__ void mma(const Params& p, SharedStorage& s, const VarlenTile&, uint32_t tmem_acc, int& iteration) {
    mma_stages<TiledMma, SmemLayoutA, SmemLayoutB, kTileM, kTileN, kStages>(s.a, s.b, s.full, s.empty, tmem_acc,
                                                                             k_tiles(p), iteration);
  }
};

}  // namespace sonicmoe::sm100
