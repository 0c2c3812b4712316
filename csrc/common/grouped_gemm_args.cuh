// Device-side construction of the per-expert grouped GEMM arguments from expert_offsets.
//
// One thread per expert turns the row range [offsets[e], offsets[e+1]) into a problem shape,
// operand pointers and packed strides, so the host never reads routing data (no sync, CUDA-graph
// capturable). The persistent tile scheduler then reads the shapes on the device. Where rows end
// early (partial_rows: offsets[E] <= m_total) the rows past offsets[E] belong to no expert, so they
// are neither read nor written.
//
// B's layout is in StrideB: b[e] starts at e * n_out * k either way, and the packed stride of the
// (n_out, k) problem is K-contiguous for the (E, n_out, k) weight (ColumnMajor B, K2) and
// N-contiguous for the (E, k, n_out) one (RowMajor B, K6).
#pragma once

#include <cstdint>
#include <cstdio>
#include <type_traits>

#include "cutlass/util/packed_stride.hpp"

namespace sonicmoe {

template <class ProblemShapeT, class ElementA, class ElementB, class ElementOut, class StrideA,
          class StrideB, class StrideOut>
struct GroupedGemmDeviceArgs {
  ProblemShapeT* problem_shapes;
  const ElementA** ptr_a;
  const ElementB** ptr_b;
  ElementOut** ptr_out;
  StrideA* stride_a;
  StrideB* stride_b;
  StrideOut* stride_out;
  // K6's router addend (out[r] += addend_scale[r] * addend_rows[e]) in a CUTLASS epilogue that
  // reads one pointer per group: expert e's first scale and its addend row. Null without it.
  const float** ptr_addend_scale = nullptr;
  const ElementOut** ptr_addend_rows = nullptr;
};

template <class Args, class ElementA, class ElementB, class ElementOut>
__global__ void build_grouped_gemm_args_kernel(Args args, const int32_t* __restrict__ expert_offsets,
                                               int num_experts, int m_total, bool rows_end_early,
                                               int n_out, int k,
                                               const ElementA* a, const ElementB* b,
                                               ElementOut* out, const float* addend_scale,
                                               const ElementOut* addend_rows) {
  using ProblemShape = std::remove_pointer_t<decltype(args.problem_shapes)>;
  using StrideA = std::remove_pointer_t<decltype(args.stride_a)>;
  using StrideB = std::remove_pointer_t<decltype(args.stride_b)>;
  using StrideOut = std::remove_pointer_t<decltype(args.stride_out)>;

  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= num_experts) return;
  const int begin = expert_offsets[e];
  const int end = expert_offsets[e + 1];
  const bool valid = begin >= 0 && begin <= end && end <= m_total && (e > 0 || begin == 0) &&
                     (e + 1 < num_experts || end == m_total || rows_end_early);
  if (!valid) {
    // Reading past a, b or out would corrupt memory: stop loudly instead.
    printf("sonicmoe grouped_gemm: expert_offsets[%d:%d] = (%d, %d) breaks the rule "
           "0 = offsets[0] <= ... <= offsets[E] %s m_total = %d\n",
           e, e + 2, begin, end, rows_end_early ? "<=" : "=", m_total);
    __trap();
  }
  const int m = end - begin;
  args.problem_shapes[e] = ProblemShape{m, n_out, k};
  args.ptr_a[e] = a + int64_t(begin) * k;
  args.ptr_b[e] = b + int64_t(e) * n_out * k;
  args.ptr_out[e] = out + int64_t(begin) * n_out;
  args.stride_a[e] = cutlass::make_cute_packed_stride(StrideA{}, cute::make_shape(m, k, 1));
  args.stride_b[e] = cutlass::make_cute_packed_stride(StrideB{}, cute::make_shape(n_out, k, 1));
  args.stride_out[e] = cutlass::make_cute_packed_stride(StrideOut{}, cute::make_shape(m, n_out, 1));
  if (args.ptr_addend_scale != nullptr) {
    args.ptr_addend_scale[e] = addend_scale + begin;  // indexed by the global sorted row
    args.ptr_addend_rows[e] = addend_rows + int64_t(e) * n_out;
  }
}

}  // namespace sonicmoe
