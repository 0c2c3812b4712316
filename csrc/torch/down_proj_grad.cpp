// torch.ops.sonicmoe.down_proj_grad (K4): validation, allocation, launch on the current stream.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <tuple>

#include "sm100/grouped_gemm_sm100.h"
#include "sonicmoe.h"
#include "torch/checks.h"
#include "torch/ops.h"

namespace sonicmoe::torch_ops {
namespace {

constexpr const char* kOp = "down_proj_grad";

DownProjGradParams down_proj_grad_shape(const at::Tensor& d_out, const at::Tensor& w2,
                                        const at::Tensor& gather_idx) {
  DownProjGradParams p;
  p.num_tokens = d_out.size(0);
  p.d = d_out.size(1);
  p.n = w2.size(2);
  p.m_total = gather_idx.size(0);
  p.num_experts = static_cast<int>(w2.size(0));
  return p;
}

// Every argument, in the order a user would fix it: the devices last (a CPU tensor fails there).
void check_down_proj_grad_args(const at::Tensor& d_out, const at::Tensor& w2, const at::Tensor& h,
                               const at::Tensor& row_score, const at::Tensor& expert_offsets,
                               const at::Tensor& gather_idx, int64_t tile_config, int64_t activation) {
  check_dtype(kOp, d_out, "d_out", at::kBFloat16);
  check_dtype(kOp, w2, "w2", at::kBFloat16);
  check_dtype(kOp, h, "h", at::kBFloat16);
  check_dtype(kOp, row_score, "row_score", at::kFloat);
  check_dtype(kOp, expert_offsets, "expert_offsets", at::kInt);
  check_dtype(kOp, gather_idx, "gather_idx", at::kInt);
  check_dim(kOp, d_out, "d_out", 2, "(num_tokens, d)");
  check_dim(kOp, w2, "w2", 3, "(num_experts, d, n)");
  check_dim(kOp, h, "h", 2, "(m_total, 2n)");
  check_dim(kOp, row_score, "row_score", 1, "(m_total)");
  check_dim(kOp, expert_offsets, "expert_offsets", 1, "(num_experts + 1)");
  check_dim(kOp, gather_idx, "gather_idx", 1, "(m_total)");
  const int64_t m = gather_idx.size(0), n = w2.size(2);
  check_arg(d_out.size(1) == w2.size(1), kOp, "d_out.shape", list_text(d_out.sizes()),
            "d_out.shape[1] must equal w2.shape[1] = " + std::to_string(w2.size(1)) + " (d)");
  check_arg(h.size(0) == m && h.size(1) == 2 * n, kOp, "h.shape", list_text(h.sizes()),
            "must be (m_total, 2n) = (" + std::to_string(m) + ", " + std::to_string(2 * n) + ")");
  check_arg(row_score.size(0) == m, kOp, "row_score.shape", list_text(row_score.sizes()),
            "must be (m_total,) = (" + std::to_string(m) + ",)");
  check_arg(expert_offsets.size(0) == w2.size(0) + 1, kOp, "expert_offsets.shape",
            list_text(expert_offsets.sizes()),
            "must be (num_experts + 1,) = (" + std::to_string(w2.size(0) + 1) + ",)");
  for (const auto& [t, name] : {std::pair{&d_out, "d_out"}, {&w2, "w2"}, {&h, "h"}, {&row_score, "row_score"},
                                {&expert_offsets, "expert_offsets"}, {&gather_idx, "gather_idx"}})
    check_contiguous(kOp, *t, name);
  check_aligned16(kOp, d_out, "d_out");
  check_aligned16(kOp, w2, "w2");
  check_aligned16(kOp, h, "h");
  DownProjGradParams shape = down_proj_grad_shape(d_out, w2, gather_idx);
  shape.sm_count = 1;
  shape.config = tile_config_arg(kOp, tile_config);
  shape.activation = activation_arg(kOp, activation);
  const std::string problem = check_down_proj_grad(shape);
  TORCH_CHECK_VALUE(problem.empty(), problem);
  check_same_cuda_device(kOp, {{&d_out, "d_out"}, {&w2, "w2"}, {&h, "h"}, {&row_score, "row_score"},
                               {&expert_offsets, "expert_offsets"}, {&gather_idx, "gather_idx"}});
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> down_proj_grad_cuda(
    const at::Tensor& d_out, const at::Tensor& w2, const at::Tensor& h, const at::Tensor& row_score,
    const at::Tensor& expert_offsets, const at::Tensor& gather_idx, bool partial_rows, int64_t tile_config,
    int64_t activation) {
  check_down_proj_grad_args(d_out, w2, h, row_score, expert_offsets, gather_idx, tile_config, activation);
  const c10::cuda::CUDAGuard guard(d_out.device());
  DownProjGradParams p = down_proj_grad_shape(d_out, w2, gather_idx);
  p.partial_rows = partial_rows;
  p.config = static_cast<GemmTileConfig>(tile_config);
  check_sm100_rules(d_out, p, sm100::check_down_proj_grad);
  p.activation = static_cast<GluActivation>(activation);
  const int64_t blocks = (p.n + kDownProjGradBlockCols - 1) / kDownProjGradBlockCols;
  at::Tensor d_h = at::empty({p.m_total, 2 * p.n}, d_out.options());
  at::Tensor a_scaled = at::empty({p.m_total, p.n}, d_out.options());
  at::Tensor d_score_partial = at::empty({p.m_total, blocks}, d_out.options().dtype(at::kFloat));
  if (p.m_total == 0) return {d_h, a_scaled, d_score_partial};
  p.d_out = d_out.data_ptr();
  p.w2 = w2.data_ptr();
  p.h = h.data_ptr();
  p.row_score = row_score.data_ptr<float>();
  p.expert_offsets = expert_offsets.data_ptr<int32_t>();
  p.gather_idx = gather_idx.data_ptr<int32_t>();
  p.d_h = d_h.data_ptr();
  p.a_scaled = a_scaled.data_ptr();
  p.d_score_partial = d_score_partial.data_ptr<float>();
  p.sm_count = device_sm_count(d_out);
  p.stream = c10::cuda::getCurrentCUDAStream(d_out.get_device()).stream();
  const Status status = run_down_proj_grad(p);
  TORCH_CHECK(status.ok(), status.message);
  return {d_h, a_scaled, d_score_partial};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> down_proj_grad_cpu(
    const at::Tensor& d_out, const at::Tensor& w2, const at::Tensor& h, const at::Tensor& row_score,
    const at::Tensor& expert_offsets, const at::Tensor& gather_idx, bool partial_rows, int64_t tile_config,
    int64_t activation) {
  // Raises: d_out is on the CPU.
  check_down_proj_grad_args(d_out, w2, h, row_score, expert_offsets, gather_idx, tile_config, activation);
  return {};
}

}  // namespace sonicmoe::torch_ops
