// sm100 (Blackwell, sm_100a) varlen-M grouped GEMM, K2 (b_layout NK) and K6 (b_layout KN, with or
// without the router addend): CUTLASS 4.2's ptr-array grouped GEMM, composed and launched the way
// sm90/grouped_gemm_launch_sm90.cuh does it.
//
// Mainloop: TMA loads of A (one expert's rows) and B (its weight, K- or N-contiguous as stored)
// into smem, tcgen05 MMA with the fp32 accumulators in tensor memory, 1-SM or 2-SM (a CTA pair of
// a 2 x 1 cluster on one MMA). Epilogue: TMEM -> registers -> smem -> TMA store of bf16 D, no C
// operand; K6's addend as an epilogue visitor tree on the registers. Scheduler: CUTLASS's
// persistent group scheduler over the per-expert shapes in device memory, which the shared
// argument kernel (common/grouped_gemm_args.cuh) builds from expert_offsets: no host sync.
#pragma once

#include <cuda_runtime_api.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_compute_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_load_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"

#include "common/cuda_check.h"
#include "common/grouped_gemm_args.cuh"
#include "common/grouped_gemm_workspace.h"
#include "common/ptr_array_grouped_gemm_run.cuh"
#include "sm100/arch_guard_sm100.h"
#include "sm100/grouped_gemm_sm100.h"

namespace sonicmoe::sm100 {

template <GemmConfig Config, WeightLayout kBLayout, bool kRowAddend>
struct GroupedGemmKernel {
  static constexpr GemmShapeSm100 kShape = gemm_shape(Config);
  static_assert(!kRowAddend || kBLayout == WeightLayout::kKN, "the router addend is K6's (b_layout KN)");

  using Element = cutlass::bfloat16_t;
  using ElementAccumulator = float;
  using LayoutA = cutlass::layout::RowMajor;     // (M, K), K contiguous
  // B as CUTLASS's (N, K) operand, read by TMA as stored: the (E, n_out, k) weight is K-contiguous
  // (ColumnMajor, K2), the (E, k, n_out) one N-contiguous (RowMajor, K6: no transpose).
  using LayoutB = cute::conditional_t<kBLayout == WeightLayout::kKN, cutlass::layout::RowMajor,
                                      cutlass::layout::ColumnMajor>;
  using LayoutOut = cutlass::layout::RowMajor;   // (M, N), N contiguous
  static constexpr int kAlignment = 16 / sizeof(Element);  // TMA needs 16-byte rows

  // The MMA tile (over the CTA pair for 2-SM) and a static cluster: the shapes are fixed per
  // configuration, so no runtime cluster shape (hw_info.cluster_shape) is needed.
  using MmaTileShape = cute::Shape<cute::Int<kShape.m>, cute::Int<kShape.n>, cute::Int<kShape.k>>;
  using ClusterShape = cute::Shape<cute::Int<kShape.cluster_m>, cute::Int<kShape.cluster_n>, cute::_1>;
  // What one CTA stores (the pair splits the MMA tile's rows), as CUTLASS's builder derives it.
  using CtaTileShape = cute::Shape<cute::Int<kShape.m / (kShape.two_sm ? 2 : 1)>, cute::Int<kShape.n>,
                                   cute::Int<kShape.k>>;
  using KernelSchedule =
      cute::conditional_t<kShape.two_sm, cutlass::gemm::KernelPtrArrayTmaWarpSpecialized2SmSm100,
                          cutlass::gemm::KernelPtrArrayTmaWarpSpecialized1SmSm100>;
  using EpilogueSchedule = cute::conditional_t<kShape.two_sm, cutlass::epilogue::PtrArrayTmaWarpSpecialized2Sm,
                                               cutlass::epilogue::PtrArrayTmaWarpSpecialized1Sm>;
  using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;

  // K6's router addend as an epilogue visitor tree: D = addend_scale[r] * addend_rows[e] + acc in
  // fp32, one rounding to bf16. Both broadcasts take an array of per-group pointers, which CUTLASS
  // indexes by the ptr-array group (the expert); the argument kernel points them at the expert's
  // first sorted row's scale (any row offset, so scalar loads: alignment 1) and at its addend row.
  using RowScale = cutlass::epilogue::fusion::Sm90ColBroadcast<
      0, CtaTileShape, float*, float, cute::Stride<cute::_1, cute::_0, cute::_0>, /*Alignment=*/1>;
  using ExpertRow = cutlass::epilogue::fusion::Sm90RowBroadcast<
      0, CtaTileShape, Element*, float, cute::Stride<cute::_0, cute::_1, cute::_0>, kAlignment>;
  using RowAddend = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::homogeneous_multiply_add, Element, float,
                                             cutlass::FloatRoundStyle::round_to_nearest>,
      RowScale, ExpertRow, cutlass::epilogue::fusion::Sm90AccFetch>;
  using Fusion = cute::conditional_t<kRowAddend, RowAddend,
                                     cutlass::epilogue::fusion::LinearCombination<Element, ElementAccumulator, void>>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassTensorOp, MmaTileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAccumulator, ElementAccumulator,
      void, LayoutOut*, kAlignment,  // no C operand: D = A @ B (+ the addend)
      Element, LayoutOut*, kAlignment, EpilogueSchedule, Fusion>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassTensorOp, Element, LayoutA*, kAlignment, Element,
      LayoutB*, kAlignment, ElementAccumulator, MmaTileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop,
                                                      CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  using Args = PtrArrayArgs<Kernel, Element>;  // the per-expert arrays, in the shared workspace

  static typename Gemm::Arguments make_arguments(const typename Args::DeviceArgs& dev, int num_experts,
                                                 int sm_count) {
    cutlass::KernelHardwareInfo hw_info;
    hw_info.sm_count = sm_count;
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGrouped,
        // Host problem shapes stay null: the scheduler reads the device ones.
        {num_experts, dev.problem_shapes, nullptr},
        {dev.ptr_a, dev.stride_a, dev.ptr_b, dev.stride_b},
        {{}, nullptr, nullptr, dev.ptr_out, dev.stride_out},
        hw_info};
    if constexpr (kRowAddend) {
      // The visitor tree's arguments, children first: scales, addend rows, accumulator, FMA.
      args.epilogue.thread = {{dev.ptr_addend_scale}, {dev.ptr_addend_rows}, {}, {}};
    } else {
      // One alpha and beta for every group (no per-group pointer arrays).
      args.epilogue.thread.alpha = 1.0f;
      args.epilogue.thread.beta = 0.0f;
    }
    return args;
  }
};

template <GemmConfig Config, WeightLayout kBLayout, bool kRowAddend>
size_t grouped_gemm_cutlass_workspace_size(int num_experts, int sm_count) {
  return ptr_array_cutlass_workspace_size<GroupedGemmKernel<Config, kBLayout, kRowAddend>>(num_experts, sm_count);
}

template <GemmConfig Config, WeightLayout kBLayout, bool kRowAddend>
Status run_grouped_gemm(const GroupedGemmParams& p) {
  return run_ptr_array_grouped_gemm<GroupedGemmKernel<Config, kBLayout, kRowAddend>>(
      p, kBLayout == WeightLayout::kKN ? "grouped_gemm KN (sm100)" : "grouped_gemm (sm100)");
}

}  // namespace sonicmoe::sm100

// Explicit instantiation of one kernel (configuration, B layout, addend); used once per
// csrc/instantiations/*_sm100.cu.
#define SONICMOE_INSTANTIATE_GROUPED_GEMM_SM100(CONFIG, B_LAYOUT, ROW_ADDEND)                            \
  template size_t sonicmoe::sm100::grouped_gemm_cutlass_workspace_size<CONFIG, B_LAYOUT, ROW_ADDEND>(int, \
                                                                                                    int);   \
  template sonicmoe::Status sonicmoe::sm100::run_grouped_gemm<CONFIG, B_LAYOUT, ROW_ADDEND>(               \
      const sonicmoe::GroupedGemmParams&)
