// Layout of the grouped GEMM's device workspace. Host-only arithmetic (tested without a GPU).
//
// The per-expert CUTLASS arguments (problem shape, A/B/D pointers and strides, and for sm100's K6
// with the router addend its scale and addend-row pointers) are written on the device from
// expert_offsets, so the host never reads routing data.
#pragma once

#include <cstddef>

namespace sonicmoe {

// Bytes reserved per expert for each argument array; the sm90 launch static_asserts that the
// CUTLASS types fit.
constexpr size_t kProblemShapeSlotBytes = 16;  // Shape<int,int,int> is 12 bytes
constexpr size_t kPointerSlotBytes = 8;
constexpr size_t kStrideSlotBytes = 24;        // Stride<int64_t, _1, _0> is 8 bytes
// TMA descriptors in CUTLASS's part need 128-byte alignment; use it for every section.
constexpr size_t kWorkspaceAlignment = 128;

constexpr size_t align_up(size_t bytes, size_t alignment) {
  return (bytes + alignment - 1) / alignment * alignment;
}

struct GroupedGemmWorkspaceLayout {
  size_t problem_shapes = 0;  // byte offsets from the workspace base
  size_t ptr_a = 0;
  size_t ptr_b = 0;
  size_t ptr_out = 0;
  size_t stride_a = 0;
  size_t stride_b = 0;
  size_t stride_out = 0;
  size_t ptr_addend_scale = 0;  // per expert: addend_scale + offsets[e] (sm100 K6 with the addend)
  size_t ptr_addend_rows = 0;   // per expert: addend_rows + e * n_out
  size_t cutlass = 0;
  size_t total = 0;           // bytes
};

constexpr GroupedGemmWorkspaceLayout grouped_gemm_workspace_layout(int num_experts,
                                                                   size_t cutlass_bytes) {
  const size_t e = num_experts > 0 ? static_cast<size_t>(num_experts) : 0;
  GroupedGemmWorkspaceLayout layout;
  size_t offset = 0;
  auto section = [&](size_t bytes) {
    size_t start = offset;
    offset = align_up(offset + bytes, kWorkspaceAlignment);
    return start;
  };
  layout.problem_shapes = section(e * kProblemShapeSlotBytes);
  layout.ptr_a = section(e * kPointerSlotBytes);
  layout.ptr_b = section(e * kPointerSlotBytes);
  layout.ptr_out = section(e * kPointerSlotBytes);
  layout.stride_a = section(e * kStrideSlotBytes);
  layout.stride_b = section(e * kStrideSlotBytes);
  layout.stride_out = section(e * kStrideSlotBytes);
  layout.ptr_addend_scale = section(e * kPointerSlotBytes);
  layout.ptr_addend_rows = section(e * kPointerSlotBytes);
  layout.cutlass = section(cutlass_bytes);
  layout.total = offset;
  return layout;
}

}  // namespace sonicmoe
