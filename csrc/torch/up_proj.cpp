// torch.ops.sonicmoe.up_proj (K1): validation, allocation, launch on the current stream.
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

constexpr const char* kOp = "up_proj";

UpProjParams up_proj_shape(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& gather_idx) {
  UpProjParams p;
  p.num_tokens = x.size(0);
  p.d = x.size(1);
  p.n = w1.size(1) / 2;
  p.m_total = gather_idx.size(0);
  p.num_experts = static_cast<int>(w1.size(0));
  return p;
}

// Every argument, in the order a user would fix it: the devices last (a CPU tensor fails there).
void check_up_proj_args(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& expert_offsets,
                        const at::Tensor& gather_idx, int64_t tile_config, int64_t activation) {
  check_dtype(kOp, x, "x", at::kBFloat16);
  check_dtype(kOp, w1, "w1", at::kBFloat16);
  check_dtype(kOp, expert_offsets, "expert_offsets", at::kInt);
  check_dtype(kOp, gather_idx, "gather_idx", at::kInt);
  check_dim(kOp, x, "x", 2, "(num_tokens, d)");
  check_dim(kOp, w1, "w1", 3, "(num_experts, 2n, d)");
  check_dim(kOp, expert_offsets, "expert_offsets", 1, "(num_experts + 1)");
  check_dim(kOp, gather_idx, "gather_idx", 1, "(m_total)");
  const int64_t num_experts = w1.size(0);
  check_arg(num_experts >= 1, kOp, "w1.shape", list_text(w1.sizes()),
            "needs at least one expert (w1.shape[0] >= 1)");
  check_arg(w1.size(1) % 2 == 0, kOp, "w1.shape", list_text(w1.sizes()),
            "w1.shape[1] must be even: rows [0, n) gate, [n, 2n) up");
  check_arg(x.size(1) == w1.size(2), kOp, "x.shape", list_text(x.sizes()),
            "x.shape[1] must equal w1.shape[2] = " + std::to_string(w1.size(2)) + " (d)");
  check_arg(expert_offsets.size(0) == num_experts + 1, kOp, "expert_offsets.shape",
            list_text(expert_offsets.sizes()),
            "must be (num_experts + 1,) = (" + std::to_string(num_experts + 1) + ",)");
  check_contiguous(kOp, x, "x");
  check_contiguous(kOp, w1, "w1");
  check_contiguous(kOp, expert_offsets, "expert_offsets");
  check_contiguous(kOp, gather_idx, "gather_idx");
  check_aligned16(kOp, x, "x");
  check_aligned16(kOp, w1, "w1");
  UpProjParams shape = up_proj_shape(x, w1, gather_idx);
  shape.sm_count = 1;  // the device is not known yet
  shape.config = tile_config_arg(kOp, tile_config);
  shape.activation = activation_arg(kOp, activation);
  const std::string problem = check_up_proj(shape);
  TORCH_CHECK_VALUE(problem.empty(), problem);
  check_same_cuda_device(kOp, {{&x, "x"}, {&w1, "w1"}, {&expert_offsets, "expert_offsets"},
                               {&gather_idx, "gather_idx"}});
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> up_proj_cuda(const at::Tensor& x, const at::Tensor& w1,
                                                const at::Tensor& expert_offsets,
                                                const at::Tensor& gather_idx, bool keep_h,
                                                bool partial_rows, int64_t tile_config, int64_t activation) {
  check_up_proj_args(x, w1, expert_offsets, gather_idx, tile_config, activation);
  const c10::cuda::CUDAGuard guard(x.device());
  UpProjParams p = up_proj_shape(x, w1, gather_idx);
  p.config = static_cast<GemmTileConfig>(tile_config);
  check_sm100_rules(x, p, sm100::check_up_proj);
  at::Tensor h = at::empty({keep_h ? p.m_total : 0, 2 * p.n}, x.options());
  at::Tensor a = at::empty({p.m_total, p.n}, x.options());
  if (p.m_total == 0) return {h, a};

  p.x = x.data_ptr();
  p.w1 = w1.data_ptr();
  p.expert_offsets = expert_offsets.data_ptr<int32_t>();
  p.gather_idx = gather_idx.data_ptr<int32_t>();
  p.h = keep_h ? h.data_ptr() : nullptr;
  p.a = a.data_ptr();
  p.sm_count = device_sm_count(x);
  p.partial_rows = partial_rows;
  p.activation = static_cast<GluActivation>(activation);
  p.stream = c10::cuda::getCurrentCUDAStream(x.get_device()).stream();
  const Status status = run_up_proj(p);
  TORCH_CHECK(status.ok(), status.message);
  return {h, a};
}

std::tuple<at::Tensor, at::Tensor> up_proj_cpu(const at::Tensor& x, const at::Tensor& w1,
                                               const at::Tensor& expert_offsets,
                                               const at::Tensor& gather_idx, bool keep_h,
                                               bool partial_rows, int64_t tile_config, int64_t activation) {
  check_up_proj_args(x, w1, expert_offsets, gather_idx, tile_config, activation);  // raises: x is on the CPU
  return {};
}

}  // namespace sonicmoe::torch_ops
