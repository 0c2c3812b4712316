// sm90 varlen-M grouped GEMM: CUTLASS 3.x composition and launch.
//
// Mainloop: TMA loads of A (rows of one expert) and B (that expert's weight), WGMMA, a
// warp-specialised producer warp and two consumer warpgroups (ping-pong or cooperative per
// tile config). Epilogue: TMA store of bf16 D, no C operand. Scheduler: CUTLASS's persistent
// group scheduler, which walks the per-expert problem shapes in device memory; those shapes are
// built on the device from expert_offsets (common/grouped_gemm_args.cuh), so the host never
// reads routing data. K1, K4 and K6 replace the mainloop (gather) or epilogue (SwiGLU) here.
#pragma once

#include <cuda_runtime_api.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"

#include "common/cuda_check.h"
#include "common/grouped_gemm_args.cuh"
#include "common/grouped_gemm_workspace.h"
#include "common/ptr_array_grouped_gemm_run.cuh"
#include "common/tile_size.h"
#include "sm90/grouped_gemm_sm90.h"

namespace sonicmoe::sm90 {

template <GemmTileConfig Config>
struct GroupedGemmKernel {
  static constexpr GemmTileShape kTile = gemm_tile_shape(Config);
  static_assert(kTile.m > 0, "GroupedGemmKernel needs a concrete tile config, not kAuto");

  using Element = cutlass::bfloat16_t;
  using ElementAccumulator = float;
  using LayoutA = cutlass::layout::RowMajor;     // (M, K), K contiguous
  using LayoutB = cutlass::layout::ColumnMajor;  // B^T of the (N, K) weight: K contiguous
  using LayoutOut = cutlass::layout::RowMajor;   // (M, N), N contiguous
  static constexpr int kAlignment = 16 / sizeof(Element);  // TMA needs 16-byte rows

  using TileShape = cute::Shape<cute::Int<kTile.m>, cute::Int<kTile.n>, cute::Int<kTile.k>>;
  using ClusterShape = cute::Shape<cute::Int<kTile.cluster_m>, cute::Int<kTile.cluster_n>, cute::_1>;
  using KernelSchedule =
      cute::conditional_t<kTile.pingpong, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong,
                          cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>;
  using EpilogueSchedule =
      cute::conditional_t<kTile.pingpong, cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong,
                          cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>;
  using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAccumulator, ElementAccumulator,
      void, LayoutOut*, kAlignment,  // no C operand: D = A @ B
      Element, LayoutOut*, kAlignment, EpilogueSchedule,
      cutlass::epilogue::fusion::LinearCombination<Element, ElementAccumulator, void>>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA*, kAlignment, Element,
      LayoutB*, kAlignment, ElementAccumulator, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop,
                                                      CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  using Args = PtrArrayArgs<Kernel, Element>;  // the per-expert arrays, in the shared workspace

  static typename Gemm::Arguments make_arguments(const typename Args::DeviceArgs& dev, int num_experts,
                                                 int sm_count) {
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGrouped,
        // Host problem shapes stay null: the scheduler reads the device ones.
        {num_experts, dev.problem_shapes, nullptr},
        {dev.ptr_a, dev.stride_a, dev.ptr_b, dev.stride_b},
        {{}, nullptr, nullptr, dev.ptr_out, dev.stride_out}};
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    args.hw_info.sm_count = sm_count;
    return args;
  }
};

template <GemmTileConfig Config>
size_t grouped_gemm_cutlass_workspace_size(int num_experts, int sm_count) {
  return ptr_array_cutlass_workspace_size<GroupedGemmKernel<Config>>(num_experts, sm_count);
}

template <GemmTileConfig Config>
Status run_grouped_gemm(const GroupedGemmParams& p) {
  return run_ptr_array_grouped_gemm<GroupedGemmKernel<Config>>(p, "grouped_gemm");
}

}  // namespace sonicmoe::sm90

// Explicit instantiation of one configuration; used once per csrc/instantiations/*.cu.
#define SONICMOE_INSTANTIATE_GROUPED_GEMM_SM90(CONFIG)                                        \
  template size_t sonicmoe::sm90::grouped_gemm_cutlass_workspace_size<CONFIG>(int, int);      \
  template sonicmoe::Status sonicmoe::sm90::run_grouped_gemm<CONFIG>(                          \
      const sonicmoe::GroupedGemmParams&)
