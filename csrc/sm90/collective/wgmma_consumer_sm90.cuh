// Pieces shared by the sm90 varlen mainloops (varlen_mainloop_sm90.cuh: varlen M; and
// varlen_k_mainloop_sm90.cuh: varlen K): the consumer warpgroup's WGMMA loop over the stage
// ring. The cp.async copies the gathering producers use are in sm90/ptx.cuh.
#pragma once

#include <cstdint>

#include "cute/atom/mma_traits_sm90_gmma.hpp"
#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"

#include "sm90/ptx.cuh"

namespace sonicmoe::sm90 {

// The ring's stage buffers (whole multiples of 1024 bytes, so no padding), and apart from them
// its barriers: the kernel packs both with its epilogue buffers into 227 KB.
template <class Element, class SmemLayoutA, class SmemLayoutB>
struct StageBuffers {
  alignas(1024) Element a[cute::cosize_v<SmemLayoutA>];
  alignas(1024) Element b[cute::cosize_v<SmemLayoutB>];
};

template <int kStages>
struct StageBarriers {
  uint64_t full[kStages];   // the producer's copies of a stage have landed
  uint64_t empty[kStages];  // the consumer's WGMMAs have finished reading a stage

  __device__ void init(uint32_t full_arrivals, uint32_t empty_arrivals) {
    for (int i = 0; i < kStages; ++i) {
      cutlass::arch::ClusterBarrier::init(&full[i], full_arrivals);
      cutlass::arch::ClusterBarrier::init(&empty[i], empty_arrivals);
    }
    cutlass::arch::fence_barrier_init();
  }

  // In a cluster the peer's consumers release this CTA's stages by remote arrivals until they
  // finish: before the CTA may exit, its producer waits for every stage's release past its last
  // fill (`iteration` = the CTA's k steps). One thread suffices.
  __device__ void wait_all_released(int iteration) {
    for (int i = iteration; i < iteration + kStages; ++i)
      cutlass::arch::ClusterBarrier::wait(&empty[i % kStages], ((i / kStages) & 1) ^ 1);
  }
};

// One consumer warp's release of a stage: an arrival on its empty barrier in every CTA of the
// cluster (the same shared-memory offset in each; mapa finds the peer's).
template <int kClusterSize>
__device__ inline void release_stage(uint64_t* empty) {
  if constexpr (kClusterSize == 1) {
    cutlass::arch::ClusterBarrier::arrive(empty);
  } else {
    CUTLASS_PRAGMA_UNROLL
    for (int cta = 0; cta < kClusterSize; ++cta) cutlass::arch::ClusterBarrier::arrive(empty, cta, 1);
  }
}

// accum = A_tile @ B_tile^T over num_k_tiles stages of the ring, starting at ring position
// `iteration` (advanced past them). Each stage is released to the producer once the WGMMAs
// reading it have completed (one step later, so one batch is always in flight); num_k_tiles
// must be >= 1. Called by every warpgroup of TiledMma, with the thread's index among them (one
// release per warp).
// kCpAsyncOperand: an operand arrives through the generic proxy (cp.async), which WGMMA, an
// async-proxy reader, must be fenced against. kClusterSize > 1: the stage was also written by the
// other CTAs' multicasts, so it is released in every CTA of the cluster.
template <class TiledMma, class SmemLayoutA, class SmemLayoutB, int kStages, bool kCpAsyncOperand,
          int kClusterSize = 1, class Element, class Accumulator>
__device__ void consume_stages(Element* smem_a, Element* smem_b, uint64_t* full, uint64_t* empty,
                               Accumulator& accum, int num_k_tiles, int& iteration,
                               int mma_thread_idx) {
  using namespace cute;
  Tensor sA = make_tensor(make_smem_ptr(smem_a), SmemLayoutA{});
  Tensor sB = make_tensor(make_smem_ptr(smem_b), SmemLayoutB{});
  TiledMma tiled_mma;
  auto thr_mma = tiled_mma.get_thread_slice(mma_thread_idx);
  Tensor tCrA = thr_mma.make_fragment_A(thr_mma.partition_A(sA));  // (MMA, MMA_M, MMA_K, PIPE)
  Tensor tCrB = thr_mma.make_fragment_B(thr_mma.partition_B(sB));  // (MMA, MMA_N, MMA_K, PIPE)
  const bool releases = mma_thread_idx % 32 == 0;

  tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
  warpgroup_fence_operand(accum);
  int previous_stage = -1;
  for (int kt = 0; kt < num_k_tiles; ++kt, ++iteration) {
    const int stage = iteration % kStages;
    cutlass::arch::ClusterBarrier::wait(&full[stage], (iteration / kStages) & 1);
    if constexpr (kCpAsyncOperand) fence_proxy_async_shared_cta();
    warpgroup_arrive();
    CUTLASS_PRAGMA_UNROLL
    for (int kb = 0; kb < size<2>(tCrA); ++kb) {
      cute::gemm(tiled_mma, tCrA(_, _, kb, stage), tCrB(_, _, kb, stage), accum);
      tiled_mma.accumulate_ = GMMA::ScaleOut::One;
    }
    warpgroup_commit_batch();
    warpgroup_wait<1>();  // the previous step's WGMMAs are done: its stage can be refilled
    if (previous_stage >= 0 && releases) release_stage<kClusterSize>(&empty[previous_stage]);
    previous_stage = stage;
  }
  warpgroup_wait<0>();
  if (releases) release_stage<kClusterSize>(&empty[previous_stage]);
  warpgroup_fence_operand(accum);
}

}  // namespace sonicmoe::sm90
