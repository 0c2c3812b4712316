// torch.ops.sonicmoe.weight_grad (K5, K7): validation, allocation, launch on the current stream.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "sm100/grouped_gemm_sm100.h"
#include "sonicmoe.h"
#include "torch/checks.h"
#include "torch/ops.h"

namespace sonicmoe::torch_ops {
namespace {

constexpr const char* kOp = "weight_grad";

WeightGradParams weight_grad_shape(const at::Tensor& a, const at::Tensor& b,
                                   const at::Tensor& expert_offsets, const at::Tensor& gather_idx,
                                   bool gather_a, bool partial_rows, int64_t tile_config) {
  WeightGradParams p;
  p.config = tile_config_arg(kOp, tile_config);
  p.gather_a = gather_a;
  p.partial_rows = partial_rows;
  p.num_tokens = (gather_a ? a : b).size(0);
  p.m_total = gather_idx.size(0);
  p.m_out = a.size(1);
  p.n_out = b.size(1);
  p.num_experts = static_cast<int>(expert_offsets.size(0) - 1);
  return p;
}

// Every argument, in the order a user would fix it: the devices last (a CPU tensor fails there).
void check_weight_grad_args(const at::Tensor& a, const at::Tensor& b, const at::Tensor& expert_offsets,
                            const at::Tensor& gather_idx, bool gather_a, bool partial_rows,
                            int64_t tile_config, int64_t sm_margin) {
  check_dtype(kOp, a, "a", at::kBFloat16);
  check_dtype(kOp, b, "b", at::kBFloat16);
  check_dtype(kOp, expert_offsets, "expert_offsets", at::kInt);
  check_dtype(kOp, gather_idx, "gather_idx", at::kInt);
  check_dim(kOp, a, "a", 2, gather_a ? "(num_tokens, m_out)" : "(m_total, m_out)");
  check_dim(kOp, b, "b", 2, gather_a ? "(m_total, n_out)" : "(num_tokens, n_out)");
  check_dim(kOp, expert_offsets, "expert_offsets", 1, "(num_experts + 1)");
  check_dim(kOp, gather_idx, "gather_idx", 1, "(m_total)");
  check_arg(expert_offsets.size(0) >= 2, kOp, "expert_offsets.shape", list_text(expert_offsets.sizes()),
            "needs at least one expert (num_experts + 1 >= 2 entries)");
  const at::Tensor& rows = gather_a ? b : a;
  check_arg(rows.size(0) == gather_idx.size(0), kOp, gather_a ? "b.shape" : "a.shape",
            list_text(rows.sizes()),
            "shape[0] must equal gather_idx.shape[0] = " + std::to_string(gather_idx.size(0)) +
                " (m_total: the sorted rows)");
  for (const auto& [t, name] : {std::pair{&a, "a"}, {&b, "b"}, {&expert_offsets, "expert_offsets"},
                                {&gather_idx, "gather_idx"}})
    check_contiguous(kOp, *t, name);
  check_aligned16(kOp, a, "a");
  check_aligned16(kOp, b, "b");
  check_arg(sm_margin >= 0, kOp, "sm_margin", text(sm_margin), "must be >= 0 (SMs left to other streams' work)");
  WeightGradParams shape = weight_grad_shape(a, b, expert_offsets, gather_idx, gather_a, partial_rows, tile_config);
  shape.sm_count = 1;
  const std::string problem = check_weight_grad(shape);
  TORCH_CHECK_VALUE(problem.empty(), problem);
  check_same_cuda_device(kOp, {{&a, "a"}, {&b, "b"}, {&expert_offsets, "expert_offsets"},
                               {&gather_idx, "gather_idx"}});
}

}  // namespace

at::Tensor weight_grad_cuda(const at::Tensor& a, const at::Tensor& b, const at::Tensor& expert_offsets,
                            const at::Tensor& gather_idx, bool gather_a, bool partial_rows, int64_t tile_config,
                            int64_t sm_margin, bool rows_past_end_zeroed) {
  check_weight_grad_args(a, b, expert_offsets, gather_idx, gather_a, partial_rows, tile_config, sm_margin);
  const c10::cuda::CUDAGuard guard(a.device());
  const int device_sms = device_sm_count(a);
  check_arg(sm_margin < device_sms, kOp, "sm_margin", text(sm_margin),
            "must be below the device's " + std::to_string(device_sms) + " SMs (the grid needs one)");
  WeightGradParams p = weight_grad_shape(a, b, expert_offsets, gather_idx, gather_a, partial_rows, tile_config);
  p.rows_past_end_zeroed = rows_past_end_zeroed;
  check_sm100_rules(a, p, sm100::check_weight_grad);
  at::Tensor out = at::empty({p.num_experts, p.m_out, p.n_out}, a.options());
  p.a = a.data_ptr();
  p.b = b.data_ptr();
  p.expert_offsets = expert_offsets.data_ptr<int32_t>();
  p.gather_idx = gather_idx.data_ptr<int32_t>();
  p.out = out.data_ptr();
  p.sm_count = device_sms - static_cast<int>(sm_margin);
  p.stream = c10::cuda::getCurrentCUDAStream(a.get_device()).stream();
  const Status status = run_weight_grad(p);
  TORCH_CHECK(status.ok(), status.message);
  return out;
}

at::Tensor weight_grad_cpu(const at::Tensor& a, const at::Tensor& b, const at::Tensor& expert_offsets,
                           const at::Tensor& gather_idx, bool gather_a, bool partial_rows, int64_t tile_config,
                           int64_t sm_margin, bool /*rows_past_end_zeroed*/) {
  // Raises: a CPU tensor fails the device check.
  check_weight_grad_args(a, b, expert_offsets, gather_idx, gather_a, partial_rows, tile_config, sm_margin);
  return {};
}

}  // namespace sonicmoe::torch_ops
