// The stage ring of the sm100 mainloops (the varlen-M gather mainloop, K1 / K4, and the varlen-K
// one, K5 / K7): its shared memory, and the MMA warp's side: per k step, the stage's tcgen05.mma
// into one fp32 accumulator in tensor memory, issued by one thread (the MMA atom elects it), then a
// tcgen05.commit that releases the stage once the MMAs have read it.
#pragma once

#include <cstdint>

#include "cute/atom/mma_traits_sm100.hpp"
#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"

#include "common/ptx.cuh"

namespace sonicmoe::sm100 {

// kStages stages of A and B (each 1024-byte aligned: the 128-byte swizzle repeats every 1024
// bytes) and each stage's full and empty barriers.
template <class Element, class SmemLayoutA, class SmemLayoutB, int kStages>
struct StageRing {
  alignas(1024) Element a[cute::cosize_v<SmemLayoutA>];
  alignas(1024) Element b[cute::cosize_v<SmemLayoutB>];
  uint64_t full[kStages];
  uint64_t empty[kStages];

  __device__ void init(uint32_t full_arrivals, uint32_t empty_arrivals) {
    for (int i = 0; i < kStages; ++i) {
      cutlass::arch::ClusterBarrier::init(&full[i], full_arrivals);
      cutlass::arch::ClusterBarrier::init(&empty[i], empty_arrivals);
    }
  }

  // A producer's k step `iteration` (the CTA's count of them: the position in the ring): waits until
  // its stage is free again and returns the stage.
  __device__ int wait_empty(int iteration) {
    const int stage = iteration % kStages;
    cutlass::arch::ClusterBarrier::wait(&empty[stage], ((iteration / kStages) & 1) ^ 1);
    return stage;
  }

  // The same for the TMA issuer, whose arrival also announces the stage's `bytes`.
  __device__ int wait_empty_expect_tx(int iteration, uint32_t bytes) {
    const int stage = wait_empty(iteration);
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&full[stage], bytes);
    return stage;
  }
};

// accumulator (TMEM columns [tmem_acc, tmem_acc + kTileN)) = sum over num_k_tiles steps of the
// stages' A_tile @ B_tile^T. `iteration` counts the CTA's k steps: the position in the ring.
// The whole MMA warp calls it.
template <class TiledMma, class SmemLayoutA, class SmemLayoutB, int kTileM, int kTileN, int kStages, class Element>
__device__ __forceinline__ void mma_stages(Element* smem_a, Element* smem_b, uint64_t* full, uint64_t* empty,
                                           uint32_t tmem_acc, int num_k_tiles, int& iteration) {
  using namespace cute;
  TiledMma tiled_mma;
  auto thr_mma = tiled_mma.get_slice(0);
  Tensor tCrA = thr_mma.make_fragment_A(make_tensor(make_smem_ptr(smem_a), SmemLayoutA{}));  // (MMA, M, K, PIPE)
  Tensor tCrB = thr_mma.make_fragment_B(make_tensor(make_smem_ptr(smem_b), SmemLayoutB{}));  // (MMA, N, K, PIPE)
  Tensor accum = TiledMma::make_fragment_C(partition_shape_C(TiledMma{}, make_shape(Int<kTileM>{}, Int<kTileN>{})));
  accum.data() = tmem_acc;
  tiled_mma.accumulate_ = UMMA::ScaleOut::Zero;
  for (int kt = 0; kt < num_k_tiles; ++kt, ++iteration) {
    const int stage = iteration % kStages;
    cutlass::arch::ClusterBarrier::wait(&full[stage], (iteration / kStages) & 1);
    // The cp.async data landed through the generic proxy; the MMA reads shared memory through the
    // async proxy.
    fence_proxy_async_shared_cta();
    CUTLASS_PRAGMA_UNROLL
    for (int kb = 0; kb < size<2>(tCrA); ++kb) {
      cute::gemm(tiled_mma, tCrA(_, _, kb, stage), tCrB(_, _, kb, stage), accum);
      tiled_mma.accumulate_ = UMMA::ScaleOut::One;
    }
    cutlass::arch::umma_arrive(&empty[stage]);  // the stage is free once these MMAs have read it
  }
}

}  // namespace sonicmoe::sm100
