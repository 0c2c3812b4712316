// The sm90 varlen grouped GEMM kernel: composition of a tile scheduler (varlen_tile_scheduler.cuh),
// a mainloop (collective/varlen_mainloop_sm90.cuh for varlen M: K1, K2, K4, K6;
// collective/varlen_k_mainloop_sm90.cuh for varlen K: K5, K7) and an epilogue (one of
// epilogue/*_epilogue_sm90.cuh, to the interface of epilogue/epilogue_interface.h).
//
// 384 threads: warpgroup 0 produces (TMA, or cp.async gather plus TMA), warpgroups 1 and 2
// consume, either in ping-pong (Mainloop::kConsumers == 1: they take alternate tiles of the
// CTA's persistent sequence, so one warpgroup's epilogue runs while the other's WGMMAs keep
// the tensor cores busy) or cooperatively (kConsumers == 2: both work on every tile, half its
// rows each). Register budgets are rebalanced with setmaxnreg (producer 40 / 72 when gathering,
// consumers 232 / 216).
#pragma once

#include <cstdint>
#include <type_traits>

#include "cute/arch/cluster_sm90.hpp"
#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/arch/reg_reconfig.h"

#include "sm90/epilogue/epilogue_interface.h"
#include "common/varlen_tile_scheduler.cuh"

namespace sonicmoe::sm90 {

template <class Mainloop_, class Epilogue_,
          class Scheduler_ = VarlenTileScheduler<Mainloop_::kTileM, Mainloop_::kClusterM>>
struct VarlenGemmKernel {
  using Mainloop = Mainloop_;
  using Epilogue = Epilogue_;
  using Scheduler = Scheduler_;
  static constexpr int kTileM = Mainloop::kTileM;
  static constexpr int kTileN = Mainloop::kTileN;
  static constexpr bool kCooperative = Mainloop::kConsumers == 2;
  // Launched in 2 x 1 clusters when 2, on either schedule: both CTAs walk the same pairs, so a
  // ping-pong pair has the same consumer in both and each stage's releases (both CTAs') come
  // from that consumer's warps.
  static constexpr int kClusterM = Mainloop::kClusterM;
  static_assert(Mainloop::kConsumers == 1 || kCooperative, "one or two consumer warpgroups per tile");
  static_assert(check_epilogue_interface<Epilogue>(), "the epilogue interface (epilogue/epilogue_interface.h)");
  static constexpr int kThreads = 384;
  // The gathering producer holds row tokens and cp.async addresses; at 56 registers it spilled
  // in its k loop (ncu: ~0.9M local-memory requests per call, K1 stalled on them).
  static constexpr int kProducerRegs = Mainloop::kCpAsyncProducer ? 72 : 40;
  static constexpr int kConsumerRegs = Mainloop::kCpAsyncProducer ? 216 : 232;
  // setmaxnreg.inc takes registers from those the CTA has released: a thread starts with 168 (64K
  // over 384 threads, in steps of 8), so the budgets may add up to 3 x 168, not 512 (a kernel
  // asking for more hangs in its consumers' first setmaxnreg).
  static constexpr int kEntryRegs = 65536 / kThreads / 8 * 8;
  static_assert(kProducerRegs + 2 * kConsumerRegs <= 3 * kEntryRegs, "more registers than the CTA starts with");
  using EpilogueSmem = typename EpilogueSmemOf<Epilogue>::type;
  static constexpr size_t kEpilogueSmemAlign = alignof(EpilogueSmem) > 16 ? alignof(EpilogueSmem) : 16;

  struct SharedStorage {
    typename Mainloop::SharedStorage mainloop;
    alignas(kEpilogueSmemAlign) EpilogueSmem epilogue[2];  // one per consumer warpgroup
    typename Mainloop::Barriers stage_barriers;
    // mma_turn[c] completes a phase when the other consumer has issued a tile's mainloop: the
    // ping-pong order (below).
    uint64_t mma_turn[2];
  };
  static constexpr size_t kSmemBytes = sizeof(SharedStorage);
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than an sm90 CTA may use");

  using Params = VarlenKernelParams<typename Mainloop::Params, typename Epilogue::Params>;

  static __device__ void run(const Params& p, char* smem_raw) {
    using namespace cute;
    // The 128-byte swizzle of TMA and WGMMA repeats every 1024 bytes: stages must start there.
    if (cute::cast_smem_ptr_to_uint(smem_raw) % 1024 != 0) __trap();
    SharedStorage& s = *reinterpret_cast<SharedStorage*>(smem_raw);
    const int warpgroup = threadIdx.x / 128;
    const int thread_in_warpgroup = threadIdx.x % 128;

    validate_expert_offsets(p);
    if (threadIdx.x == 0) {
      cutlass::arch::ClusterBarrier::init(&s.mma_turn[0], 4);  // one arrival per warp
      cutlass::arch::ClusterBarrier::init(&s.mma_turn[1], 4);
      if constexpr (LoadsSource<Epilogue>::value) Epilogue::init_source(p.epilogue, s.epilogue);
      Mainloop::init_barriers(s.stage_barriers);  // ends with the barriers' init fence
      Mainloop::prefetch_descriptors(p.mainloop);
    }
    if constexpr (kClusterM > 1) {
      // The peer's multicasts and releases land on this CTA's barriers: all initialised first.
      cute::cluster_arrive_relaxed();
      cute::cluster_wait();
    } else {
      __syncthreads();
    }

    const int n_blocks = Epilogue::n_blocks(p.epilogue);
    Scheduler scheduler = Scheduler::make(p, n_blocks);
    VarlenTile tile;
    int iteration = 0;  // k steps of this CTA so far: the position in the stage ring

    if (warpgroup == 0) {
      cutlass::arch::warpgroup_reg_dealloc<kProducerRegs>();
      while (scheduler.next(tile)) {
        Mainloop::load(p.mainloop, s.mainloop, s.stage_barriers, tile,
                       Epilogue::b_rows(p.epilogue, tile), iteration, thread_in_warpgroup);
      }
      Mainloop::load_tail();
      if (thread_in_warpgroup == 0) Mainloop::drain(s.stage_barriers, iteration);
      return;
    }

    cutlass::arch::warpgroup_reg_alloc<kConsumerRegs>();
    const int consumer = warpgroup - 1;
    // The MMA's thread index: within the warpgroup (ping-pong), or across both (cooperative).
    const int mma_thread = kCooperative ? threadIdx.x - 128 : thread_in_warpgroup;
    typename Mainloop::TiledMma tiled_mma;
    auto thr_mma = tiled_mma.get_thread_slice(mma_thread);
    Tensor accum = partition_fragment_C(tiled_mma, Shape<Int<kTileM>, Int<kTileN>>{});
    Tensor coords = thr_mma.partition_C(make_identity_tensor(Shape<Int<kTileM>, Int<kTileN>>{}));
    const bool warp_leader = thread_in_warpgroup % 32 == 0;
    for (int j = 0; scheduler.next(tile); ++j) {
      if constexpr (!kCooperative) {
        if (j % 2 != consumer) {  // the other consumer's tile: skip its k steps in the ring
          iteration += Mainloop::k_tiles(p.mainloop, tile);
          continue;
        }
        // Ping-pong order: tile j's mainloop starts once tile j - 1's has been issued by the
        // other consumer. Besides alternating the tensor cores between the two, this keeps every
        // wait on a stage barrier within one phase of that barrier: a consumer skips the other's
        // k steps, and a parity wait more than one phase ahead would pass on stale data.
        if (j > 0) cutlass::arch::ClusterBarrier::wait(&s.mma_turn[consumer], ((j - 1) / 2) & 1);
      }
      if constexpr (LoadsSource<Epilogue>::value)
        Epilogue::load_source(p.epilogue, s.epilogue[consumer], tile, coords, thread_in_warpgroup);
      Mainloop::mma(p.mainloop, s.mainloop, s.stage_barriers, accum, tile, iteration, mma_thread);
      if constexpr (!kCooperative) {
        if (warp_leader) cutlass::arch::ClusterBarrier::arrive(&s.mma_turn[1 - consumer]);
      }
      // Each warpgroup stores its own accumulator rows through its own staging buffer.
      Epilogue::store(p.epilogue, s.epilogue[consumer], accum, coords, tile, thread_in_warpgroup,
                      /*barrier_id=*/consumer);
    }
    if constexpr (HasFinish<Epilogue>::value) Epilogue::finish(thread_in_warpgroup);
  }
};

template <class Kernel>
__global__ void __launch_bounds__(Kernel::kThreads, 1)
    varlen_gemm_kernel(const __grid_constant__ typename Kernel::Params params) {
  extern __shared__ __align__(1024) char smem[];
  Kernel::run(params, smem);
}

}  // namespace sonicmoe::sm90
