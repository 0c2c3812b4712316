// The sm100 varlen gathered GEMM kernel (K1, K4, K5, K7): a persistent, warp-specialized composition
// of a varlen tile scheduler (common/varlen_tile_scheduler.cuh, read from expert_offsets on the
// device: VarlenTileScheduler, varlen M, for K1 / K4; VarlenKTileScheduler, varlen K, for K5 / K7),
// a mainloop with a gathered A (collective/varlen_gather_mainloop_sm100.cuh, varlen M;
// collective/varlen_k_mainloop_sm100.cuh, varlen K) and an epilogue reading tensor memory
// (epilogue/*_sm100.cuh).
//
// 320 threads, 10 warps, each role walking the CTA's tile sequence on its own:
//   warps 0-3  epilogue: TMEM -> registers -> global (warp w reads TMEM lanes 32 w .. 32 w + 31,
//              the hardware's rule for warp w % 4)
//   warps 4-7  A producers: the cp.async gather (Mainloop::load_a)
//   warp 8     B producer: one thread issues B's TMA boxes (Mainloop::load_b)
//   warp 9     MMA: allocates TMEM, one thread issues tcgen05.mma, frees TMEM at the end
// Two accumulators in TMEM (2 x kTileN columns: all 512 at kTileN = 256): the MMAs of tile j + 1
// run while the epilogue drains tile j. acc_full[i] completes with the MMA warp's commit of a
// tile's last MMA, acc_empty[i] with the 4 epilogue warps' arrivals once their TMEM loads are done.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cute/arch/tmem_allocator_sm100.hpp"
#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"

#include "common/varlen_tile_scheduler.cuh"

namespace sonicmoe::sm100 {

// tcgen05's ordering around thread synchronisation (TMEM accesses before / after a barrier).
__device__ __forceinline__ void tcgen05_before_thread_sync() {
  asm volatile("tcgen05.fence::before_thread_sync;\n" ::: "memory");
}
__device__ __forceinline__ void tcgen05_after_thread_sync() {
  asm volatile("tcgen05.fence::after_thread_sync;\n" ::: "memory");
}

template <class Mainloop_, class Epilogue_, class Scheduler_ = VarlenTileScheduler<Mainloop_::kTileM>>
struct VarlenGatherGemmKernel {
  using Mainloop = Mainloop_;
  using Epilogue = Epilogue_;
  using Scheduler = Scheduler_;
  // Varlen K: a fixed output per expert (Params::m_out rows), the reduction over its rows.
  static constexpr bool kVarlenK = std::is_same_v<Scheduler, VarlenKTileScheduler<Mainloop::kTileM>>;
  static constexpr int kTileM = Mainloop::kTileM;
  static constexpr int kTileN = Mainloop::kTileN;
  static constexpr int kAccumulators = 2;
  static constexpr int kTmemColumns = kAccumulators * kTileN;  // fp32: one column per output column
  static_assert(kTmemColumns <= 512 && (kTmemColumns & (kTmemColumns - 1)) == 0,
                "TMEM allocations are powers of 2 of at most 512 columns");
  static constexpr int kEpilogueWarp0 = 0, kGatherWarp0 = 4, kTmaWarp = 8, kMmaWarp = 9;
  static constexpr int kThreads = 320;
  static_assert(Epilogue::kThreads == 128 && Mainloop::kGatherThreads == 128, "warp roles");
  // The MMA warp frees TMEM once the epilogue warps are done with it: a named barrier of those
  // 160 threads (CUTLASS's NamedBarrier id 1, placed past the ids CUTLASS reserves).
  static constexpr int kTmemFreeBarrier = 1, kTmemFreeThreads = Epilogue::kThreads + 32;

  struct SharedStorage {
    typename Mainloop::SharedStorage mainloop;
    uint64_t acc_full[kAccumulators];
    uint64_t acc_empty[kAccumulators];
    uint32_t tmem_base;
  };
  static constexpr size_t kSmemBytes = sizeof(SharedStorage);
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than an sm100 CTA may use");

  using Params = VarlenKernelParams<typename Mainloop::Params, typename Epilogue::Params>;  // m_out: varlen K

  static __device__ void run(const Params& p, char* smem_raw) {
    // The 128-byte swizzle repeats every 1024 bytes: stages must start there.
    if (cute::cast_smem_ptr_to_uint(smem_raw) % 1024 != 0) __trap();
    SharedStorage& s = *reinterpret_cast<SharedStorage*>(smem_raw);
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;

    validate_expert_offsets(p);
    if (threadIdx.x == 0) {
      Mainloop::init(s.mainloop);
      for (int i = 0; i < kAccumulators; ++i) {
        cutlass::arch::ClusterBarrier::init(&s.acc_full[i], 1);                        // the MMA's commit
        cutlass::arch::ClusterBarrier::init(&s.acc_empty[i], Epilogue::kThreads / 32);  // one per warp
      }
      cutlass::arch::fence_barrier_init();
      Mainloop::prefetch_descriptors(p.mainloop);
    }
    cute::TMEM::Allocator1Sm tmem;
    if (warp == kMmaWarp) {
      tmem.allocate(kTmemColumns, &s.tmem_base);
      tmem.release_allocation_lock();  // let the next CTA on this SM allocate once this one frees
    }
    tcgen05_before_thread_sync();
    __syncthreads();
    tcgen05_after_thread_sync();
    const uint32_t tmem_base = s.tmem_base;

    const int n_blocks = Epilogue::n_blocks(p.epilogue);
    Scheduler scheduler(p, n_blocks);
    VarlenTile tile;
    int iteration = 0;  // k steps of this CTA so far: the position in the stage ring

    if (warp >= kGatherWarp0 && warp < kTmaWarp) {
      const int thread_idx = threadIdx.x - kGatherWarp0 * 32;
      while (scheduler.next(tile)) Mainloop::load_a(p.mainloop, s.mainloop, tile, iteration, thread_idx);
      cp_async_wait_all();  // no thread exits with copies in flight
    } else if (warp == kTmaWarp) {
      if (lane != 0) return;
      while (scheduler.next(tile))
        Mainloop::load_b(p.mainloop, s.mainloop, tile, Epilogue::b_rows(p.epilogue, tile), iteration);
    } else if (warp == kMmaWarp) {
      for (int j = 0; scheduler.next(tile); ++j) {
        const int acc = j % kAccumulators;
        cutlass::arch::ClusterBarrier::wait(&s.acc_empty[acc], ((j / kAccumulators) & 1) ^ 1);
        tcgen05_after_thread_sync();
        Mainloop::mma(p.mainloop, s.mainloop, tile, tmem_base + acc * kTileN, iteration);
        cutlass::arch::umma_arrive(&s.acc_full[acc]);  // the tile's MMAs are done: to the epilogue
      }
      cutlass::arch::NamedBarrier::sync(kTmemFreeThreads, kTmemFreeBarrier);
      tcgen05_after_thread_sync();
      tmem.free(tmem_base, kTmemColumns);
    } else {  // the epilogue warps
      for (int j = 0; scheduler.next(tile); ++j) {
        const int acc = j % kAccumulators;
        cutlass::arch::ClusterBarrier::wait(&s.acc_full[acc], (j / kAccumulators) & 1);
        tcgen05_after_thread_sync();
        Epilogue::store(p.epilogue, tmem_base + acc * kTileN, tile, threadIdx.x);
        tcgen05_before_thread_sync();
        __syncwarp();
        if (lane == 0) cutlass::arch::ClusterBarrier::arrive(&s.acc_empty[acc]);
      }
      tcgen05_before_thread_sync();
      cutlass::arch::NamedBarrier::arrive(kTmemFreeThreads, kTmemFreeBarrier);
    }
  }
};

template <class Kernel>
__global__ void __launch_bounds__(Kernel::kThreads, 1)
    varlen_gather_gemm_kernel(const __grid_constant__ typename Kernel::Params params) {
  extern __shared__ __align__(1024) char smem[];
  Kernel::run(params, smem);
}

}  // namespace sonicmoe::sm100
