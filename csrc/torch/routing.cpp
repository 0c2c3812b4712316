// torch.ops.sonicmoe.router_topk, rounding_probs, routing_metadata and router_backward (routing R
// and its backward): validation, allocation, launch.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <climits>
#include <optional>
#include <tuple>
#include <utility>

#include "sonicmoe.h"
#include "torch/checks.h"
#include "torch/ops.h"

namespace sonicmoe::torch_ops {
namespace {

// Router logits (T, E): fp32 or bf16, 2-D, contiguous (router_topk's and rounding_probs').
void check_logits(const char* op, const at::Tensor& logits) {
  check_arg(logits.scalar_type() == at::kFloat || logits.scalar_type() == at::kBFloat16, op,
            "logits.dtype", c10::toString(logits.scalar_type()), "must be Float or BFloat16");
  check_dim(op, logits, "logits", 2, "(T, E)");
  check_contiguous(op, logits, "logits");
}

// router_topk's arguments, the device last (a CPU tensor fails there); the params (pointers aside) it
// launches with.
RouterTopkParams router_topk_args(const at::Tensor& logits, int64_t top_k, int64_t mode) {
  check_logits("router_topk", logits);
  RouterTopkParams p;
  p.logits_bf16 = logits.scalar_type() == at::kBFloat16;
  p.num_tokens = logits.size(0);
  p.num_experts = int32_arg("router_topk", "num_experts", logits.size(1));
  p.top_k = int32_arg("router_topk", "top_k", top_k);
  p.mode = int32_arg("router_topk", "mode", mode);
  const std::string problem = check_router_topk(p);
  TORCH_CHECK_VALUE(problem.empty(), problem);
  check_same_cuda_device("router_topk", {{&logits, "logits"}});
  return p;
}

// rounding_probs' arguments, the device last; the params (pointers aside) it launches with.
RoundingProbsParams rounding_probs_args(const at::Tensor& logits, int64_t top_k) {
  check_logits("rounding_probs", logits);
  RoundingProbsParams p;
  p.logits_bf16 = logits.scalar_type() == at::kBFloat16;
  p.num_tokens = logits.size(0);
  p.num_experts = int32_arg("rounding_probs", "num_experts", logits.size(1));
  p.top_k = int32_arg("rounding_probs", "top_k", top_k);
  const std::string problem = check_rounding_probs(p);
  TORCH_CHECK_VALUE(problem.empty(), problem);
  check_same_cuda_device("rounding_probs", {{&logits, "logits"}});
  return p;
}

// routing_metadata's arguments, the device last; the params (pointers aside) it launches with.
SortedLayoutParams routing_metadata_args(const at::Tensor& experts, int64_t num_experts) {
  constexpr const char* kOp = "routing_metadata";
  check_arg(experts.scalar_type() == at::kInt || experts.scalar_type() == at::kLong, kOp,
            "experts.dtype", c10::toString(experts.scalar_type()), "must be Int or Long");
  check_dim(kOp, experts, "experts", 2, "(T, K)");
  check_contiguous(kOp, experts, "experts");
  SortedLayoutParams p;
  p.experts_int64 = experts.scalar_type() == at::kLong;
  p.num_tokens = experts.size(0);
  p.top_k = int32_arg(kOp, "top_k", experts.size(1));
  p.num_experts = int32_arg(kOp, "num_experts", num_experts);
  const std::string problem = check_sorted_layout(p);
  TORCH_CHECK_VALUE(problem.empty(), problem);
  check_same_cuda_device(kOp, {{&experts, "experts"}});
  return p;
}

// router_backward's arguments, the devices last; the params (pointers aside) it launches with.
RouterBackwardParams router_backward_args(const at::Tensor& d_score_partial, const at::Tensor& rev_idx,
                                          const at::Tensor& scores, const at::Tensor& experts,
                                          const std::optional<at::Tensor>& logits, int64_t num_experts,
                                          int64_t mode) {
  constexpr const char* kOp = "router_backward";
  check_dtype(kOp, d_score_partial, "d_score_partial", at::kFloat);
  check_dtype(kOp, rev_idx, "rev_idx", at::kInt);
  check_dtype(kOp, scores, "scores", at::kFloat);
  check_dtype(kOp, experts, "experts", at::kInt);
  check_dim(kOp, d_score_partial, "d_score_partial", 2, "(rows, slots)");
  check_dim(kOp, rev_idx, "rev_idx", 2, "(T, K)");
  for (const auto& [t, name] : {std::pair{&scores, "scores"}, std::pair{&experts, "experts"}})
    check_arg(t->sizes() == rev_idx.sizes(), kOp, std::string(name) + ".shape", list_text(t->sizes()),
              "must equal rev_idx.shape = " + list_text(rev_idx.sizes()));
  check_contiguous(kOp, d_score_partial, "d_score_partial");
  check_contiguous(kOp, rev_idx, "rev_idx");
  check_contiguous(kOp, scores, "scores");
  check_contiguous(kOp, experts, "experts");
  const bool over_all = mode == static_cast<int>(RouterMode::kSoftmaxTopk);
  check_arg(logits.has_value() == over_all, kOp, "logits", logits.has_value() ? "a tensor" : "None",
            "is softmax_topk's (mode 1) alone: its gradient reads the softmax over every expert");
  if (logits.has_value()) {
    check_logits(kOp, *logits);
    check_arg(logits->size(0) == rev_idx.size(0) && logits->size(1) == num_experts, kOp, "logits.shape",
              list_text(logits->sizes()), "must be (T, num_experts) = (" + text(rev_idx.size(0)) + ", " +
                                              text(num_experts) + ")");
  }
  RouterBackwardParams p;
  p.slots = int32_arg(kOp, "slots", d_score_partial.size(1));
  p.num_tokens = rev_idx.size(0);
  p.num_experts = int32_arg(kOp, "num_experts", num_experts);
  p.top_k = int32_arg(kOp, "top_k", rev_idx.size(1));
  p.num_rows = d_score_partial.size(0);
  p.mode = int32_arg(kOp, "mode", mode);
  const std::string problem = check_router_backward(p);
  TORCH_CHECK_VALUE(problem.empty(), problem);
  check_same_cuda_device(kOp, {{&d_score_partial, "d_score_partial"}, {&rev_idx, "rev_idx"}, {&scores, "scores"},
                               {&experts, "experts"}});
  if (logits.has_value()) check_same_cuda_device(kOp, {{&rev_idx, "rev_idx"}, {&*logits, "logits"}});
  return p;
}

// router_backward and router_backward_rows: d_logits (T, E) bf16 and, where d_logit_rows is given,
// d_logits at each (t, k)'s sorted row (fp32).
at::Tensor launch_router_backward(const at::Tensor& d_score_partial, const at::Tensor& rev_idx,
                                  const at::Tensor& scores, const at::Tensor& experts,
                                  const std::optional<at::Tensor>& logits, int64_t num_experts, int64_t mode,
                                  at::Tensor* d_logit_rows) {
  RouterBackwardParams p = router_backward_args(d_score_partial, rev_idx, scores, experts, logits, num_experts, mode);
  const c10::cuda::CUDAGuard guard(rev_idx.device());
  at::Tensor d_logits = at::empty({rev_idx.size(0), num_experts}, rev_idx.options().dtype(at::kBFloat16));
  if (d_logit_rows != nullptr) {
    *d_logit_rows = at::empty({d_score_partial.size(0)}, d_score_partial.options());
    p.d_logit_rows = d_logit_rows->data_ptr<float>();
  }
  p.d_score_partial = d_score_partial.data_ptr<float>();
  p.rev_idx = rev_idx.data_ptr<int32_t>();
  p.scores = scores.data_ptr<float>();
  p.experts = experts.data_ptr<int32_t>();
  p.logits = logits.has_value() ? logits->data_ptr() : nullptr;
  p.logits_bf16 = logits.has_value() && logits->scalar_type() == at::kBFloat16;
  p.d_logits = d_logits.data_ptr();
  p.stream = c10::cuda::getCurrentCUDAStream(rev_idx.get_device()).stream();
  const Status status = run_router_backward(p);
  TORCH_CHECK(status.ok(), status.message);
  return d_logits;
}

// router_backward_rows' rule beyond router_backward's: a mode whose d_logits is zero off the chosen experts.
void check_rows_mode(int64_t mode) {
  check_arg(mode != static_cast<int>(RouterMode::kSoftmaxTopk), "router_backward_rows", "mode", text(mode),
            "must be 0 (topk_softmax) or 2 (softmax_topk_norm): softmax_topk's d_logits is nonzero at every expert");
}

}  // namespace

at::Tensor router_backward_cuda(const at::Tensor& d_score_partial, const at::Tensor& rev_idx, const at::Tensor& scores,
                                const at::Tensor& experts, const std::optional<at::Tensor>& logits,
                                int64_t num_experts, int64_t mode) {
  return launch_router_backward(d_score_partial, rev_idx, scores, experts, logits, num_experts, mode, nullptr);
}

at::Tensor router_backward_cpu(const at::Tensor& d_score_partial, const at::Tensor& rev_idx, const at::Tensor& scores,
                               const at::Tensor& experts, const std::optional<at::Tensor>& logits,
                               int64_t num_experts, int64_t mode) {
  router_backward_args(d_score_partial, rev_idx, scores, experts, logits, num_experts, mode);  // raises: CPU
  return {};
}

std::tuple<at::Tensor, at::Tensor> router_backward_rows_cuda(const at::Tensor& d_score_partial,
                                                             const at::Tensor& rev_idx, const at::Tensor& scores,
                                                             const at::Tensor& experts, int64_t num_experts,
                                                             int64_t mode) {
  check_rows_mode(mode);
  at::Tensor d_logit_rows;
  at::Tensor d_logits =
      launch_router_backward(d_score_partial, rev_idx, scores, experts, std::nullopt, num_experts, mode, &d_logit_rows);
  return {d_logits, d_logit_rows};
}

std::tuple<at::Tensor, at::Tensor> router_backward_rows_cpu(const at::Tensor& d_score_partial,
                                                            const at::Tensor& rev_idx, const at::Tensor& scores,
                                                            const at::Tensor& experts, int64_t num_experts,
                                                            int64_t mode) {
  check_rows_mode(mode);
  router_backward_cpu(d_score_partial, rev_idx, scores, experts, std::nullopt, num_experts, mode);
  return {};
}

std::tuple<at::Tensor, at::Tensor> router_topk_cuda(const at::Tensor& logits, int64_t top_k, int64_t mode) {
  RouterTopkParams p = router_topk_args(logits, top_k, mode);
  const c10::cuda::CUDAGuard guard(logits.device());
  at::Tensor scores = at::empty({logits.size(0), top_k}, logits.options().dtype(at::kFloat));
  at::Tensor experts = at::empty({logits.size(0), top_k}, logits.options().dtype(at::kInt));
  p.logits = logits.data_ptr();
  p.scores = scores.data_ptr<float>();
  p.experts = experts.data_ptr<int32_t>();
  p.stream = c10::cuda::getCurrentCUDAStream(logits.get_device()).stream();
  const Status status = run_router_topk(p);
  TORCH_CHECK(status.ok(), status.message);
  return {scores, experts};
}

std::tuple<at::Tensor, at::Tensor> router_topk_cpu(const at::Tensor& logits, int64_t top_k, int64_t mode) {
  router_topk_args(logits, top_k, mode);  // raises: CPU
  return {};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> rounding_probs_cuda(const at::Tensor& logits, int64_t top_k,
                                                                   bool write_probs) {
  RoundingProbsParams p = rounding_probs_args(logits, top_k);
  const c10::cuda::CUDAGuard guard(logits.device());
  const int64_t T = logits.size(0), E = logits.size(1);
  const auto float_options = logits.options().dtype(at::kFloat);
  at::Tensor probs = at::empty({write_probs ? T : 0, E}, float_options);
  at::Tensor probs_t = at::empty({E, T}, float_options);
  at::Tensor chosen_t = at::empty({E, T}, logits.options().dtype(at::kBool));
  p.logits = logits.data_ptr();
  p.probs = write_probs ? probs.data_ptr<float>() : nullptr;
  p.probs_t = probs_t.data_ptr<float>();
  p.chosen_t = reinterpret_cast<uint8_t*>(chosen_t.data_ptr<bool>());
  p.stream = c10::cuda::getCurrentCUDAStream(logits.get_device()).stream();
  const Status status = run_rounding_probs(p);
  TORCH_CHECK(status.ok(), status.message);
  return {probs, probs_t, chosen_t};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> rounding_probs_cpu(const at::Tensor& logits, int64_t top_k,
                                                                  bool write_probs) {
  rounding_probs_args(logits, top_k);  // raises: CPU
  return {};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> routing_metadata_cuda(const at::Tensor& experts,
                                                                     int64_t num_experts) {
  SortedLayoutParams p = routing_metadata_args(experts, num_experts);
  const c10::cuda::CUDAGuard guard(experts.device());
  const auto int_options = experts.options().dtype(at::kInt);
  at::Tensor offsets = at::empty({num_experts + 1}, int_options);
  at::Tensor gather_idx = at::empty({experts.numel()}, int_options);
  at::Tensor rev_idx = at::empty(experts.sizes(), int_options);
  p.experts = experts.data_ptr();
  p.expert_offsets = offsets.data_ptr<int32_t>();
  p.gather_idx = gather_idx.data_ptr<int32_t>();
  p.rev_idx = rev_idx.data_ptr<int32_t>();
  p.workspace_bytes = sorted_layout_workspace_size(p.num_tokens, p.num_experts);
  at::Tensor workspace =
      at::empty({static_cast<int64_t>(std::max<size_t>(p.workspace_bytes, 4))}, experts.options().dtype(at::kByte));
  p.workspace = workspace.data_ptr();
  p.stream = c10::cuda::getCurrentCUDAStream(experts.get_device()).stream();
  const Status status = run_sorted_layout(p);
  TORCH_CHECK(status.ok(), status.message);
  return {offsets, gather_idx, rev_idx};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> routing_metadata_cpu(const at::Tensor& experts,
                                                                    int64_t num_experts) {
  routing_metadata_args(experts, num_experts);  // raises: CPU
  return {};
}

}  // namespace sonicmoe::torch_ops
