// torch.ops.sonicmoe.grouped_gemm: validation, allocation, launch on the current stream.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "common/tile_size.h"
#include "sm100/grouped_gemm_sm100.h"
#include "sonicmoe.h"
#include "torch/checks.h"
#include "torch/ops.h"

namespace sonicmoe::torch_ops {
namespace {

constexpr const char* kOp = "grouped_gemm";

// b is (E, n_out, k) for WeightLayout::kNK and (E, k, n_out) for kKN.
GroupedGemmParams grouped_gemm_shape(const at::Tensor& a, const at::Tensor& b, int64_t tile_config,
                                     WeightLayout layout, bool partial_rows) {
  const bool kn = layout == WeightLayout::kKN;
  GroupedGemmParams p;
  p.partial_rows = partial_rows;
  p.m_total = a.size(0);
  p.k = a.size(1);
  p.n_out = b.size(kn ? 2 : 1);
  p.num_experts = static_cast<int>(b.size(0));
  p.config = static_cast<GemmTileConfig>(tile_config);
  p.b_layout = layout;
  return p;
}

// Everything that can be checked without a GPU, in the order a user would fix it.
void check_grouped_gemm_args(const at::Tensor& a, const at::Tensor& b,
                             const at::Tensor& expert_offsets, int64_t tile_config,
                             WeightLayout layout, bool partial_rows) {
  const bool kn = layout == WeightLayout::kKN;
  check_dtype(kOp, a, "a", at::kBFloat16);
  check_dtype(kOp, b, "b", at::kBFloat16);
  check_dtype(kOp, expert_offsets, "expert_offsets", at::kInt);
  check_dim(kOp, a, "a", 2, "(m_total, k)");
  check_dim(kOp, b, "b", 3, kn ? "(num_experts, k, n_out)" : "(num_experts, n_out, k)");
  check_dim(kOp, expert_offsets, "expert_offsets", 1, "(num_experts + 1)");
  const int64_t num_experts = b.size(0);
  check_arg(num_experts >= 1, kOp, "b.shape", list_text(b.sizes()),
            "needs at least one expert (b.shape[0] >= 1)");
  check_arg(expert_offsets.size(0) == num_experts + 1, kOp, "expert_offsets.shape",
            list_text(expert_offsets.sizes()),
            "must be (num_experts + 1,) = (" + std::to_string(num_experts + 1) + ",)");
  const int k_dim = kn ? 1 : 2;
  check_arg(a.size(1) == b.size(k_dim), kOp, "a.shape", list_text(a.sizes()),
            "a.shape[1] must equal b.shape[" + std::to_string(k_dim) + "] = " +
                std::to_string(b.size(k_dim)) + " (k)");
  check_contiguous(kOp, a, "a");
  check_contiguous(kOp, b, "b");
  check_contiguous(kOp, expert_offsets, "expert_offsets");
  check_aligned16(kOp, a, "a");
  check_aligned16(kOp, b, "b");
  tile_config_arg(kOp, tile_config);

  GroupedGemmParams shape = grouped_gemm_shape(a, b, tile_config, layout, partial_rows);
  shape.sm_count = 1;  // the device is not known yet; checked for real at launch
  const std::string problem = check_grouped_gemm(shape);
  TORCH_CHECK_VALUE(problem.empty(), problem);
}

// grouped_gemm_kn's addend (out[r] += addend_scale[r] * addend_rows[e]): both or neither,
// addend_scale (m_total) fp32, addend_rows (E, n_out) bf16.
void check_addend_args(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& addend_scale,
                       const std::optional<at::Tensor>& addend_rows) {
  constexpr const char* kOpKn = "grouped_gemm_kn";
  check_arg(addend_scale.has_value() == addend_rows.has_value(), kOpKn, "addend_scale",
            addend_scale.has_value() ? "a tensor" : "None", "comes with addend_rows: both or neither");
  if (!addend_scale.has_value()) return;
  check_dtype(kOpKn, *addend_scale, "addend_scale", at::kFloat);
  check_dtype(kOpKn, *addend_rows, "addend_rows", at::kBFloat16);
  check_dim(kOpKn, *addend_scale, "addend_scale", 1, "(m_total)");
  check_dim(kOpKn, *addend_rows, "addend_rows", 2, "(num_experts, n_out)");
  check_arg(addend_scale->size(0) == a.size(0), kOpKn, "addend_scale.shape", list_text(addend_scale->sizes()),
            "must be (m_total,) = (" + std::to_string(a.size(0)) + ",)");
  check_arg(addend_rows->size(0) == b.size(0) && addend_rows->size(1) == b.size(2), kOpKn, "addend_rows.shape",
            list_text(addend_rows->sizes()),
            "must be (num_experts, n_out) = (" + std::to_string(b.size(0)) + ", " + std::to_string(b.size(2)) + ")");
  check_contiguous(kOpKn, *addend_scale, "addend_scale");
  check_contiguous(kOpKn, *addend_rows, "addend_rows");
  check_aligned16(kOpKn, *addend_rows, "addend_rows");
}

// Every argument of grouped_gemm (NK) or grouped_gemm_kn (KN, with its addend), the devices last (a
// CPU tensor fails there), each error naming the op called.
void check_call(const at::Tensor& a, const at::Tensor& b, const at::Tensor& expert_offsets, int64_t tile_config,
                WeightLayout layout, bool partial_rows, const std::optional<at::Tensor>& addend_scale,
                const std::optional<at::Tensor>& addend_rows) {
  check_grouped_gemm_args(a, b, expert_offsets, tile_config, layout, partial_rows);
  check_addend_args(a, b, addend_scale, addend_rows);  // after b's shape is known to be 3-D
  const char* op = layout == WeightLayout::kNK ? kOp : "grouped_gemm_kn";
  check_same_cuda_device(op, {{&a, "a"}, {&b, "b"}, {&expert_offsets, "expert_offsets"}});
  if (addend_scale.has_value())
    check_same_cuda_device(op, {{&a, "a"}, {&*addend_scale, "addend_scale"}, {&*addend_rows, "addend_rows"}});
}

at::Tensor run_on_cuda(const at::Tensor& a, const at::Tensor& b, const at::Tensor& expert_offsets,
                       int64_t tile_config, WeightLayout layout, bool partial_rows,
                       const std::optional<at::Tensor>& addend_scale = std::nullopt,
                       const std::optional<at::Tensor>& addend_rows = std::nullopt) {
  check_call(a, b, expert_offsets, tile_config, layout, partial_rows, addend_scale, addend_rows);
  const c10::cuda::CUDAGuard guard(a.device());
  GroupedGemmParams p = grouped_gemm_shape(a, b, tile_config, layout, partial_rows);
  check_sm100_rules(a, p, sm100::check_grouped_gemm);
  at::Tensor out = at::empty({a.size(0), p.n_out}, a.options());
  if (a.size(0) == 0) return out;

  p.a = a.data_ptr();
  p.b = b.data_ptr();
  p.out = out.data_ptr();
  p.expert_offsets = expert_offsets.data_ptr<int32_t>();
  if (addend_scale.has_value()) {
    p.addend_scale = addend_scale->data_ptr<float>();
    p.addend_rows = addend_rows->data_ptr();
  }
  p.sm_count = device_sm_count(a);
  p.stream = c10::cuda::getCurrentCUDAStream(a.get_device()).stream();
  p.workspace_bytes = grouped_gemm_workspace_size(p.num_experts, p.sm_count);
  at::Tensor workspace =
      at::empty({static_cast<int64_t>(p.workspace_bytes)}, a.options().dtype(at::kByte));
  p.workspace = workspace.data_ptr();

  const Status status = run_grouped_gemm(p);
  TORCH_CHECK(status.ok(), status.message);  // a std::string: no number formatting here
  return out;
}

at::Tensor run_on_cpu(const at::Tensor& a, const at::Tensor& b, const at::Tensor& expert_offsets,
                      int64_t tile_config, WeightLayout layout, bool partial_rows,
                      const std::optional<at::Tensor>& addend_scale = std::nullopt,
                      const std::optional<at::Tensor>& addend_rows = std::nullopt) {
  check_call(a, b, expert_offsets, tile_config, layout, partial_rows, addend_scale, addend_rows);  // raises: CPU
  return {};
}

}  // namespace

at::Tensor grouped_gemm_cuda(const at::Tensor& a, const at::Tensor& b,
                             const at::Tensor& expert_offsets, int64_t tile_config, bool partial_rows) {
  return run_on_cuda(a, b, expert_offsets, tile_config, WeightLayout::kNK, partial_rows);
}

at::Tensor grouped_gemm_cpu(const at::Tensor& a, const at::Tensor& b,
                            const at::Tensor& expert_offsets, int64_t tile_config, bool partial_rows) {
  return run_on_cpu(a, b, expert_offsets, tile_config, WeightLayout::kNK, partial_rows);
}

at::Tensor grouped_gemm_kn_cuda(const at::Tensor& a, const at::Tensor& b, const at::Tensor& expert_offsets,
                                bool partial_rows, int64_t tile_config, const std::optional<at::Tensor>& addend_scale,
                                const std::optional<at::Tensor>& addend_rows) {
  return run_on_cuda(a, b, expert_offsets, tile_config, WeightLayout::kKN, partial_rows, addend_scale, addend_rows);
}

at::Tensor grouped_gemm_kn_cpu(const at::Tensor& a, const at::Tensor& b, const at::Tensor& expert_offsets,
                               bool partial_rows, int64_t tile_config, const std::optional<at::Tensor>& addend_scale,
                               const std::optional<at::Tensor>& addend_rows) {
  return run_on_cpu(a, b, expert_offsets, tile_config, WeightLayout::kKN, partial_rows, addend_scale, addend_rows);
}

}  // namespace sonicmoe::torch_ops
