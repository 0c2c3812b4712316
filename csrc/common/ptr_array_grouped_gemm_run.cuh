// The host side every arch's CUTLASS ptr-array K2 shares: the workspace carved into the per-expert
// argument arrays and CUTLASS's own part, the arguments built on the device from expert_offsets
// (grouped_gemm_args.cuh: the host never reads routing data), then can_implement / initialize /
// run. Kernel is an arch's GroupedGemmKernel: Element, ProblemShape, Args (PtrArrayArgs of its
// CUTLASS kernel), Gemm and make_arguments(dev, num_experts, sm_count).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "cutlass/cutlass.h"

#include "common/cuda_check.h"
#include "common/grouped_gemm_args.cuh"
#include "common/grouped_gemm_workspace.h"
#include "sonicmoe.h"

namespace sonicmoe {

// The per-expert argument arrays of a CUTLASS ptr-array grouped GEMM (CutlassKernel, its
// GemmUniversal kernel), each element checked against its slot of the shared workspace layout.
template <class CutlassKernel, class Element>
struct PtrArrayArgs {
  using UnderlyingProblemShape = typename CutlassKernel::ProblemShape::UnderlyingProblemShape;
  using StrideA = typename CutlassKernel::InternalStrideA;
  using StrideB = typename CutlassKernel::InternalStrideB;
  using StrideOut = typename CutlassKernel::InternalStrideD;
  using DeviceArgs = GroupedGemmDeviceArgs<UnderlyingProblemShape, Element, Element, Element, StrideA, StrideB,
                                           StrideOut>;
  static_assert(sizeof(UnderlyingProblemShape) <= kProblemShapeSlotBytes,
                "problem shape does not fit its workspace slot");
  static_assert(sizeof(StrideA) <= kStrideSlotBytes && sizeof(StrideB) <= kStrideSlotBytes &&
                    sizeof(StrideOut) <= kStrideSlotBytes,
                "a stride type does not fit its workspace slot");
};

template <class Kernel>
size_t ptr_array_cutlass_workspace_size(int num_experts, int sm_count) {
  typename Kernel::Args::DeviceArgs dev{};
  return Kernel::Gemm::get_workspace_size(Kernel::make_arguments(dev, num_experts, sm_count));
}

// op names the kernel family in the messages ("grouped_gemm", "grouped_gemm (sm100)").
template <class Kernel>
Status run_ptr_array_grouped_gemm(const GroupedGemmParams& p, const char* op) {
  using Element = typename Kernel::Element;
  const size_t cutlass_bytes = ptr_array_cutlass_workspace_size<Kernel>(p.num_experts, p.sm_count);
  const GroupedGemmWorkspaceLayout layout = grouped_gemm_workspace_layout(p.num_experts, cutlass_bytes);
  if (p.workspace_bytes < layout.total) {
    return Status::error(std::string(op) + ": workspace of " + std::to_string(p.workspace_bytes) +
                         " bytes is smaller than the " + std::to_string(layout.total) + " needed");
  }
  auto* base = static_cast<uint8_t*>(p.workspace);
  using Args = typename Kernel::Args;
  typename Args::DeviceArgs dev{
      reinterpret_cast<typename Args::UnderlyingProblemShape*>(base + layout.problem_shapes),
      reinterpret_cast<const Element**>(base + layout.ptr_a),
      reinterpret_cast<const Element**>(base + layout.ptr_b),
      reinterpret_cast<Element**>(base + layout.ptr_out),
      reinterpret_cast<typename Args::StrideA*>(base + layout.stride_a),
      reinterpret_cast<typename Args::StrideB*>(base + layout.stride_b),
      reinterpret_cast<typename Args::StrideOut*>(base + layout.stride_out)};
  if (p.addend_rows != nullptr) {  // K6's router addend: only sm100's KN addend kernel gets here with it
    dev.ptr_addend_scale = reinterpret_cast<const float**>(base + layout.ptr_addend_scale);
    dev.ptr_addend_rows = reinterpret_cast<const Element**>(base + layout.ptr_addend_rows);
  }

  constexpr int kThreads = 128;
  build_grouped_gemm_args_kernel<<<(p.num_experts + kThreads - 1) / kThreads, kThreads, 0, p.stream>>>(
      dev, p.expert_offsets, p.num_experts, static_cast<int>(p.m_total), p.partial_rows, static_cast<int>(p.n_out),
      static_cast<int>(p.k), static_cast<const Element*>(p.a), static_cast<const Element*>(p.b),
      static_cast<Element*>(p.out), p.addend_scale, static_cast<const Element*>(p.addend_rows));
  SONICMOE_CUDA_TRY(cudaGetLastError());

  typename Kernel::Gemm gemm;
  auto args = Kernel::make_arguments(dev, p.num_experts, p.sm_count);
  cutlass::Status st = gemm.can_implement(args);
  if (st != cutlass::Status::kSuccess)
    return Status::error(std::string(op) + ": CUTLASS cannot implement the problem: " + cutlassGetStatusString(st));
  st = gemm.initialize(args, base + layout.cutlass, p.stream);
  if (st != cutlass::Status::kSuccess)
    return Status::error(std::string(op) + ": CUTLASS initialize failed: " + cutlassGetStatusString(st));
  st = gemm.run(p.stream);
  if (st != cutlass::Status::kSuccess)
    return Status::error(std::string(op) + ": CUTLASS launch failed: " + cutlassGetStatusString(st));
  SONICMOE_CUDA_TRY(cudaGetLastError());
  return Status::success();
}

}  // namespace sonicmoe
