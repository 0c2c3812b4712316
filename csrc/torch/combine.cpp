// torch.ops.sonicmoe.combine: validation, allocation, launch on the current stream.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

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
}

}  // namespace

at::Tensor combine_cuda(const at::Tensor& y, const at::Tensor& scores, const at::Tensor& rev_idx) {
  check_combine_args(y, scores, rev_idx);
  check_same_cuda_device(kOp, {{&y, "y"}, {&scores, "scores"}, {&rev_idx, "rev_idx"}});
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
  check_combine_args(y, scores, rev_idx);
  // Raises: y is on the CPU.
  check_same_cuda_device(kOp, {{&y, "y"}, {&scores, "scores"}, {&rev_idx, "rev_idx"}});
  return {};
}

}  // namespace sonicmoe::torch_ops
