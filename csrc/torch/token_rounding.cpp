// torch.ops.sonicmoe.token_rounding_assign and dense_layout (token rounding on the device):
// validation, allocation, launch. Both take expert-major (E, T) tensors.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <climits>
#include <tuple>

#include "sonicmoe.h"
#include "torch/checks.h"
#include "torch/ops.h"

namespace sonicmoe::torch_ops {
namespace {

// Two expert-major (E, T) inputs of one op: their dtypes, the first 2-D, the second of its
// shape, both contiguous (in that order: the order a user would fix them).
void check_expert_major_pair(const char* op, const at::Tensor& first, const char* first_name,
                             at::ScalarType first_dtype, const at::Tensor& second, const char* second_name,
                             at::ScalarType second_dtype) {
  check_dtype(op, first, first_name, first_dtype);
  check_dtype(op, second, second_name, second_dtype);
  check_dim(op, first, first_name, 2, "(E, T)");
  check_arg(second.sizes() == first.sizes(), op, std::string(second_name) + ".shape", list_text(second.sizes()),
            std::string("must equal ") + first_name + ".shape = " + list_text(first.sizes()));
  check_contiguous(op, first, first_name);
  check_contiguous(op, second, second_name);
}

// token_rounding_assign's arguments, the devices last (a CPU tensor fails there); the params
// (pointers aside) it launches with.
TokenRoundingParams token_rounding_args(const at::Tensor& probs_t, const at::Tensor& chosen_t, int64_t tile,
                                        int64_t rule) {
  constexpr const char* kOp = "token_rounding_assign";
  check_expert_major_pair(kOp, probs_t, "probs_t", at::kFloat, chosen_t, "chosen_t", at::kBool);
  TokenRoundingParams p;
  p.num_experts = int32_arg(kOp, "num_experts", probs_t.size(0));
  p.num_tokens = probs_t.size(1);
  p.tile = int32_arg(kOp, "tile", tile);
  p.rule = int32_arg(kOp, "rule", rule);
  const std::string problem = check_token_rounding(p);
  TORCH_CHECK_VALUE(problem.empty(), problem);
  check_same_cuda_device(kOp, {{&probs_t, "probs_t"}, {&chosen_t, "chosen_t"}});
  return p;
}

// dense_layout's arguments, the devices last; the params (pointers aside) it launches with.
DenseLayoutParams dense_layout_args(const at::Tensor& assigned_t, const at::Tensor& scores_t, int64_t row_bound) {
  constexpr const char* kOp = "dense_layout";
  check_expert_major_pair(kOp, assigned_t, "assigned_t", at::kBool, scores_t, "scores_t", at::kFloat);
  check_arg(row_bound >= 0 && row_bound <= INT32_MAX, kOp, "row_bound", text(row_bound),
            "must be in [0, 2^31 - 1] (and at least the number of assigned pairs)");
  DenseLayoutParams p;
  p.num_experts = int32_arg(kOp, "num_experts", assigned_t.size(0));
  p.num_tokens = assigned_t.size(1);
  p.row_bound = row_bound;
  const std::string problem = check_dense_layout(p);
  TORCH_CHECK_VALUE(problem.empty(), problem);
  check_same_cuda_device(kOp, {{&assigned_t, "assigned_t"}, {&scores_t, "scores_t"}});
  return p;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> token_rounding_assign_cuda(const at::Tensor& probs_t, const at::Tensor& chosen_t,
                                                              int64_t tile, int64_t rule) {
  TokenRoundingParams p = token_rounding_args(probs_t, chosen_t, tile, rule);
  const c10::cuda::CUDAGuard guard(probs_t.device());
  at::Tensor assigned_t = at::empty_like(chosen_t);
  at::Tensor counts = at::empty({probs_t.size(0)}, probs_t.options().dtype(at::kInt));
  p.probs_t = probs_t.data_ptr<float>();
  p.chosen_t = reinterpret_cast<const uint8_t*>(chosen_t.data_ptr<bool>());
  p.assigned_t = reinterpret_cast<uint8_t*>(assigned_t.data_ptr<bool>());
  p.counts = counts.data_ptr<int32_t>();
  p.stream = c10::cuda::getCurrentCUDAStream(probs_t.get_device()).stream();
  const Status status = run_token_rounding_assign(p);
  TORCH_CHECK(status.ok(), status.message);
  return {assigned_t, counts};
}

std::tuple<at::Tensor, at::Tensor> token_rounding_assign_cpu(const at::Tensor& probs_t, const at::Tensor& chosen_t,
                                                             int64_t tile, int64_t rule) {
  token_rounding_args(probs_t, chosen_t, tile, rule);  // raises: CPU
  return {};
}

DenseLayoutTensors dense_layout_cuda(const at::Tensor& assigned_t, const at::Tensor& scores_t, int64_t row_bound) {
  DenseLayoutParams p = dense_layout_args(assigned_t, scores_t, row_bound);
  const c10::cuda::CUDAGuard guard(assigned_t.device());
  const int64_t E = assigned_t.size(0), T = assigned_t.size(1);
  const auto int_options = assigned_t.options().dtype(at::kInt);
  const auto float_options = assigned_t.options().dtype(at::kFloat);
  at::Tensor expert_offsets = at::empty({E + 1}, int_options);
  at::Tensor token_offsets = at::empty({T + 1}, int_options);
  // Written whole by the kernels (zeros past the M assigned pairs).
  at::Tensor gather_idx = at::empty({row_bound}, int_options);
  at::Tensor rows = at::empty({row_bound}, int_options);
  at::Tensor row_scores = at::empty({row_bound}, float_options);
  at::Tensor sorted_scores = at::empty({row_bound}, float_options);
  p.assigned_t = reinterpret_cast<const uint8_t*>(assigned_t.data_ptr<bool>());
  p.scores_t = scores_t.data_ptr<float>();
  p.expert_offsets = expert_offsets.data_ptr<int32_t>();
  p.gather_idx = gather_idx.data_ptr<int32_t>();
  p.sorted_scores = sorted_scores.data_ptr<float>();
  p.token_offsets = token_offsets.data_ptr<int32_t>();
  p.rows = rows.data_ptr<int32_t>();
  p.row_scores = row_scores.data_ptr<float>();
  p.workspace_bytes = dense_layout_workspace_size(T, p.num_experts);
  at::Tensor workspace = at::empty({static_cast<int64_t>(p.workspace_bytes)}, assigned_t.options().dtype(at::kByte));
  p.workspace = workspace.data_ptr();
  p.stream = c10::cuda::getCurrentCUDAStream(assigned_t.get_device()).stream();
  const Status status = run_dense_layout(p);
  TORCH_CHECK(status.ok(), status.message);
  return {expert_offsets, gather_idx, token_offsets, rows, row_scores, sorted_scores};
}

DenseLayoutTensors dense_layout_cpu(const at::Tensor& assigned_t, const at::Tensor& scores_t, int64_t row_bound) {
  dense_layout_args(assigned_t, scores_t, row_bound);  // raises: CPU
  return {};
}

}  // namespace sonicmoe::torch_ops
