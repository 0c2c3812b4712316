// torch.ops.sonicmoe.combine, combine_csr (K3), combine_dx (K8) and scatter_rows: validation,
// allocation, launch on the current stream.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <optional>

#include "sonicmoe.h"
#include "torch/checks.h"
#include "torch/ops.h"

namespace sonicmoe::torch_ops {
namespace {

constexpr const char* kOp = "combine";

CombineParams combine_shape(const at::Tensor& y, const at::Tensor& scores) {
  CombineParams p;
  p.num_rows = y.size(0);
  p.d = y.size(1);
  p.num_tokens = scores.size(0);
  p.top_k = static_cast<int>(scores.size(1));
  return p;
}

// Every argument, in the order a user would fix it: the devices last (a CPU tensor fails there).
void check_combine_args(const at::Tensor& y, const at::Tensor& scores, const at::Tensor& rev_idx) {
  check_dtype(kOp, y, "y", at::kBFloat16);
  check_dtype(kOp, scores, "scores", at::kFloat);
  check_dtype(kOp, rev_idx, "rev_idx", at::kInt);
  check_dim(kOp, y, "y", 2, "(num_rows, d)");
  check_dim(kOp, scores, "scores", 2, "(T, K)");
  check_dim(kOp, rev_idx, "rev_idx", 2, "(T, K)");
  check_arg(rev_idx.sizes() == scores.sizes(), kOp, "rev_idx.shape", list_text(rev_idx.sizes()),
            "must equal scores.shape = " + list_text(scores.sizes()));
  check_contiguous(kOp, y, "y");
  check_contiguous(kOp, scores, "scores");
  check_contiguous(kOp, rev_idx, "rev_idx");
  check_aligned16(kOp, y, "y");
  const std::string problem = check_combine(combine_shape(y, scores));
  TORCH_CHECK_VALUE(problem.empty(), problem);
  check_same_cuda_device(kOp, {{&y, "y"}, {&scores, "scores"}, {&rev_idx, "rev_idx"}});
}

}  // namespace

at::Tensor combine_cuda(const at::Tensor& y, const at::Tensor& scores, const at::Tensor& rev_idx) {
  check_combine_args(y, scores, rev_idx);
  const c10::cuda::CUDAGuard guard(y.device());
  at::Tensor out = at::empty({scores.size(0), y.size(1)}, y.options());
  CombineParams p = combine_shape(y, scores);
  p.y = y.data_ptr();
  p.scores = scores.data_ptr<float>();
  p.rev_idx = rev_idx.data_ptr<int32_t>();
  p.out = out.data_ptr();
  p.stream = c10::cuda::getCurrentCUDAStream(y.get_device()).stream();
  const Status status = run_combine(p);
  TORCH_CHECK(status.ok(), status.message);
  return out;
}

at::Tensor combine_cpu(const at::Tensor& y, const at::Tensor& scores, const at::Tensor& rev_idx) {
  check_combine_args(y, scores, rev_idx);  // raises: y is on the CPU
  return {};
}

namespace {

// The same for combine_csr.
void check_combine_csr_args(const at::Tensor& y, const at::Tensor& row_scores, const at::Tensor& rows,
                            const at::Tensor& token_offsets) {
  constexpr const char* op = "combine_csr";
  check_dtype(op, y, "y", at::kBFloat16);
  check_dtype(op, row_scores, "row_scores", at::kFloat);
  check_dtype(op, rows, "rows", at::kInt);
  check_dtype(op, token_offsets, "token_offsets", at::kInt);
  check_dim(op, y, "y", 2, "(num_rows, d)");
  check_dim(op, row_scores, "row_scores", 1, "(entries)");
  check_dim(op, rows, "rows", 1, "(entries)");
  check_dim(op, token_offsets, "token_offsets", 1, "(T + 1)");
  check_arg(rows.size(0) == row_scores.size(0), op, "rows.shape", list_text(rows.sizes()),
            "must equal row_scores.shape = " + list_text(row_scores.sizes()));
  check_arg(token_offsets.size(0) >= 1, op, "token_offsets.shape", list_text(token_offsets.sizes()),
            "needs T + 1 >= 1 entries");
  check_contiguous(op, y, "y");
  check_contiguous(op, row_scores, "row_scores");
  check_contiguous(op, rows, "rows");
  check_contiguous(op, token_offsets, "token_offsets");
  check_aligned16(op, y, "y");
  CombineCsrParams p;
  p.num_tokens = token_offsets.size(0) - 1;
  p.d = y.size(1);
  p.num_rows = y.size(0);
  const std::string problem = check_combine_csr(p);
  TORCH_CHECK_VALUE(problem.empty(), problem);
  check_same_cuda_device(op, {{&y, "y"}, {&row_scores, "row_scores"}, {&rows, "rows"},
                              {&token_offsets, "token_offsets"}});
}

}  // namespace

at::Tensor combine_csr_cuda(const at::Tensor& y, const at::Tensor& row_scores, const at::Tensor& rows,
                            const at::Tensor& token_offsets) {
  check_combine_csr_args(y, row_scores, rows, token_offsets);
  const c10::cuda::CUDAGuard guard(y.device());
  at::Tensor out = at::empty({token_offsets.size(0) - 1, y.size(1)}, y.options());
  CombineCsrParams p;
  p.y = y.data_ptr();
  p.row_scores = row_scores.data_ptr<float>();
  p.rows = rows.data_ptr<int32_t>();
  p.token_offsets = token_offsets.data_ptr<int32_t>();
  p.out = out.data_ptr();
  p.num_tokens = token_offsets.size(0) - 1;
  p.d = y.size(1);
  p.num_rows = y.size(0);
  p.stream = c10::cuda::getCurrentCUDAStream(y.get_device()).stream();
  const Status status = run_combine_csr(p);
  TORCH_CHECK(status.ok(), status.message);
  return out;
}

at::Tensor combine_csr_cpu(const at::Tensor& y, const at::Tensor& row_scores, const at::Tensor& rows,
                           const at::Tensor& token_offsets) {
  check_combine_csr_args(y, row_scores, rows, token_offsets);  // raises: CPU
  return {};
}

namespace {

constexpr const char* kDxOp = "combine_dx";

// combine_dx's arguments, the devices last; the params (pointers aside) it launches with.
CombineDxParams combine_dx_args(const at::Tensor& dx_rows, const at::Tensor& rev_idx,
                                const std::optional<at::Tensor>& addend) {
  check_dtype(kDxOp, dx_rows, "dx_rows", at::kBFloat16);
  check_dtype(kDxOp, rev_idx, "rev_idx", at::kInt);
  check_dim(kDxOp, dx_rows, "dx_rows", 2, "(num_rows, d)");
  check_dim(kDxOp, rev_idx, "rev_idx", 2, "(T, K)");
  check_contiguous(kDxOp, dx_rows, "dx_rows");
  check_contiguous(kDxOp, rev_idx, "rev_idx");
  check_aligned16(kDxOp, dx_rows, "dx_rows");
  if (addend.has_value()) {
    check_dtype(kDxOp, *addend, "addend", at::kBFloat16);
    check_arg(addend->dim() == 2 && addend->size(0) == rev_idx.size(0) && addend->size(1) == dx_rows.size(1), kDxOp,
              "addend.shape", list_text(addend->sizes()),
              "must be (T, d) = (" + text(rev_idx.size(0)) + ", " + text(dx_rows.size(1)) + ")");
    check_contiguous(kDxOp, *addend, "addend");
    check_aligned16(kDxOp, *addend, "addend");
  }
  CombineDxParams p;
  p.num_tokens = rev_idx.size(0);
  p.top_k = static_cast<int>(rev_idx.size(1));
  p.d = dx_rows.size(1);
  p.num_rows = dx_rows.size(0);
  const std::string problem = check_combine_dx(p);
  TORCH_CHECK_VALUE(problem.empty(), problem);
  if (addend.has_value()) {
    check_same_cuda_device(kDxOp, {{&dx_rows, "dx_rows"}, {&rev_idx, "rev_idx"}, {&*addend, "addend"}});
  } else {
    check_same_cuda_device(kDxOp, {{&dx_rows, "dx_rows"}, {&rev_idx, "rev_idx"}});
  }
  return p;
}

}  // namespace

at::Tensor combine_dx_cuda(const at::Tensor& dx_rows, const at::Tensor& rev_idx,
                           const std::optional<at::Tensor>& addend) {
  CombineDxParams p = combine_dx_args(dx_rows, rev_idx, addend);
  const c10::cuda::CUDAGuard guard(dx_rows.device());
  at::Tensor out = at::empty({rev_idx.size(0), dx_rows.size(1)}, dx_rows.options());
  p.dx_rows = dx_rows.data_ptr();
  p.rev_idx = rev_idx.data_ptr<int32_t>();
  p.addend = addend.has_value() ? addend->data_ptr() : nullptr;
  p.out = out.data_ptr();
  p.stream = c10::cuda::getCurrentCUDAStream(dx_rows.get_device()).stream();
  const Status status = run_combine_dx(p);
  TORCH_CHECK(status.ok(), status.message);
  return out;
}

at::Tensor combine_dx_cpu(const at::Tensor& dx_rows, const at::Tensor& rev_idx,
                          const std::optional<at::Tensor>& addend) {
  combine_dx_args(dx_rows, rev_idx, addend);  // raises: CPU
  return {};
}

namespace {

constexpr const char* kScatterOp = "scatter_rows";

// scatter_rows's arguments, the devices last; the params (pointers aside) it launches with.
ScatterRowsParams scatter_rows_args(const at::Tensor& x, const at::Tensor& rev_idx) {
  check_dtype(kScatterOp, x, "x", at::kBFloat16);
  check_dtype(kScatterOp, rev_idx, "rev_idx", at::kInt);
  check_dim(kScatterOp, x, "x", 2, "(T, d)");
  check_dim(kScatterOp, rev_idx, "rev_idx", 2, "(T, K)");
  check_arg(rev_idx.size(0) == x.size(0), kScatterOp, "rev_idx.shape", list_text(rev_idx.sizes()),
            "must have x.shape[0] = " + text(x.size(0)) + " rows");
  check_contiguous(kScatterOp, x, "x");
  check_contiguous(kScatterOp, rev_idx, "rev_idx");
  check_aligned16(kScatterOp, x, "x");
  ScatterRowsParams p;
  p.num_tokens = rev_idx.size(0);
  p.top_k = static_cast<int>(rev_idx.size(1));
  p.d = x.size(1);
  const std::string problem = check_scatter_rows(p);
  TORCH_CHECK_VALUE(problem.empty(), problem);
  check_same_cuda_device(kScatterOp, {{&x, "x"}, {&rev_idx, "rev_idx"}});
  return p;
}

}  // namespace

at::Tensor scatter_rows_cuda(const at::Tensor& x, const at::Tensor& rev_idx) {
  ScatterRowsParams p = scatter_rows_args(x, rev_idx);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty({rev_idx.numel(), x.size(1)}, x.options());
  p.x = x.data_ptr();
  p.rev_idx = rev_idx.data_ptr<int32_t>();
  p.out = out.data_ptr();
  p.stream = c10::cuda::getCurrentCUDAStream(x.get_device()).stream();
  const Status status = run_scatter_rows(p);
  TORCH_CHECK(status.ok(), status.message);
  return out;
}

at::Tensor scatter_rows_cpu(const at::Tensor& x, const at::Tensor& rev_idx) {
  scatter_rows_args(x, rev_idx);  // raises: CPU
  return {};
}

}  // namespace sonicmoe::torch_ops
