// Signatures of the torch.ops.sonicmoe implementations (csrc/torch/*.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

namespace sonicmoe::torch_ops {

// grouped_gemm(Tensor a, Tensor b, Tensor expert_offsets, int tile_config=0) -> Tensor
at::Tensor grouped_gemm_cuda(const at::Tensor& a, const at::Tensor& b,
                             const at::Tensor& expert_offsets, int64_t tile_config, bool partial_rows);
// CPU tensors: the same argument checks, then an error (the kernels are CUDA-only).
at::Tensor grouped_gemm_cpu(const at::Tensor& a, const at::Tensor& b,
                            const at::Tensor& expert_offsets, int64_t tile_config, bool partial_rows);

// grouped_gemm_kn(Tensor a, Tensor b, Tensor expert_offsets, bool partial_rows, int tile_config,
//                 Tensor? addend_scale, Tensor? addend_rows) -> Tensor; b (E, k, n_out)
at::Tensor grouped_gemm_kn_cuda(const at::Tensor& a, const at::Tensor& b, const at::Tensor& expert_offsets,
                                bool partial_rows, int64_t tile_config, const std::optional<at::Tensor>& addend_scale,
                                const std::optional<at::Tensor>& addend_rows);
at::Tensor grouped_gemm_kn_cpu(const at::Tensor& a, const at::Tensor& b, const at::Tensor& expert_offsets,
                               bool partial_rows, int64_t tile_config, const std::optional<at::Tensor>& addend_scale,
                               const std::optional<at::Tensor>& addend_rows);

// down_proj_grad(d_out, w2, h, row_score, expert_offsets, gather_idx, partial_rows, tile_config,
//                activation)
//   -> (d_h, a_scaled, d_score_partial)
std::tuple<at::Tensor, at::Tensor, at::Tensor> down_proj_grad_cuda(
    const at::Tensor& d_out, const at::Tensor& w2, const at::Tensor& h, const at::Tensor& row_score,
    const at::Tensor& expert_offsets, const at::Tensor& gather_idx, bool partial_rows, int64_t tile_config,
    int64_t activation);
std::tuple<at::Tensor, at::Tensor, at::Tensor> down_proj_grad_cpu(
    const at::Tensor& d_out, const at::Tensor& w2, const at::Tensor& h, const at::Tensor& row_score,
    const at::Tensor& expert_offsets, const at::Tensor& gather_idx, bool partial_rows, int64_t tile_config,
    int64_t activation);

// weight_grad(Tensor a, Tensor b, Tensor expert_offsets, Tensor gather_idx, bool gather_a,
//             bool partial_rows, int tile_config, int sm_margin, bool rows_past_end_zeroed)
//             -> Tensor (num_experts, m_out, n_out)
at::Tensor weight_grad_cuda(const at::Tensor& a, const at::Tensor& b, const at::Tensor& expert_offsets,
                            const at::Tensor& gather_idx, bool gather_a, bool partial_rows, int64_t tile_config,
                            int64_t sm_margin, bool rows_past_end_zeroed);
at::Tensor weight_grad_cpu(const at::Tensor& a, const at::Tensor& b, const at::Tensor& expert_offsets,
                           const at::Tensor& gather_idx, bool gather_a, bool partial_rows, int64_t tile_config,
                           int64_t sm_margin, bool rows_past_end_zeroed);

// token_rounding_assign(Tensor probs_t, Tensor chosen_t, int tile, int rule) -> (assigned_t, counts)
std::tuple<at::Tensor, at::Tensor> token_rounding_assign_cuda(const at::Tensor& probs_t, const at::Tensor& chosen_t,
                                                              int64_t tile, int64_t rule);
std::tuple<at::Tensor, at::Tensor> token_rounding_assign_cpu(const at::Tensor& probs_t, const at::Tensor& chosen_t,
                                                             int64_t tile, int64_t rule);

// dense_layout(Tensor assigned_t, Tensor scores_t, int row_bound)
//   -> (expert_offsets, gather_idx, token_offsets, rows, row_scores, sorted_scores)
using DenseLayoutTensors = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
DenseLayoutTensors dense_layout_cuda(const at::Tensor& assigned_t, const at::Tensor& scores_t, int64_t row_bound);
DenseLayoutTensors dense_layout_cpu(const at::Tensor& assigned_t, const at::Tensor& scores_t, int64_t row_bound);

// up_proj(Tensor x, Tensor w1, Tensor expert_offsets, Tensor gather_idx, bool keep_h=True,
//         bool partial_rows=False, int tile_config=0, int activation=0) -> (Tensor h, Tensor a)
std::tuple<at::Tensor, at::Tensor> up_proj_cuda(const at::Tensor& x, const at::Tensor& w1,
                                                const at::Tensor& expert_offsets,
                                                const at::Tensor& gather_idx, bool keep_h,
                                                bool partial_rows, int64_t tile_config, int64_t activation);
std::tuple<at::Tensor, at::Tensor> up_proj_cpu(const at::Tensor& x, const at::Tensor& w1,
                                               const at::Tensor& expert_offsets,
                                               const at::Tensor& gather_idx, bool keep_h,
                                               bool partial_rows, int64_t tile_config, int64_t activation);

// combine(Tensor y, Tensor scores, Tensor rev_idx) -> Tensor
at::Tensor combine_cuda(const at::Tensor& y, const at::Tensor& scores, const at::Tensor& rev_idx);
at::Tensor combine_cpu(const at::Tensor& y, const at::Tensor& scores, const at::Tensor& rev_idx);

// combine_dx(Tensor dx_rows, Tensor rev_idx, Tensor? addend) -> Tensor
at::Tensor combine_dx_cuda(const at::Tensor& dx_rows, const at::Tensor& rev_idx,
                           const std::optional<at::Tensor>& addend);
at::Tensor combine_dx_cpu(const at::Tensor& dx_rows, const at::Tensor& rev_idx,
                          const std::optional<at::Tensor>& addend);

// scatter_rows(Tensor x, Tensor rev_idx) -> Tensor
at::Tensor scatter_rows_cuda(const at::Tensor& x, const at::Tensor& rev_idx);
at::Tensor scatter_rows_cpu(const at::Tensor& x, const at::Tensor& rev_idx);

// router_topk(Tensor logits, int top_k, int mode) -> (Tensor scores, Tensor experts)
std::tuple<at::Tensor, at::Tensor> router_topk_cuda(const at::Tensor& logits, int64_t top_k, int64_t mode);
std::tuple<at::Tensor, at::Tensor> router_topk_cpu(const at::Tensor& logits, int64_t top_k, int64_t mode);

// router_backward(Tensor d_score_partial, Tensor rev_idx, Tensor scores, Tensor experts, Tensor? logits,
//                 int num_experts, int mode) -> Tensor d_logits (T, E) bf16
at::Tensor router_backward_cuda(const at::Tensor& d_score_partial, const at::Tensor& rev_idx, const at::Tensor& scores,
                                const at::Tensor& experts, const std::optional<at::Tensor>& logits,
                                int64_t num_experts, int64_t mode);
at::Tensor router_backward_cpu(const at::Tensor& d_score_partial, const at::Tensor& rev_idx, const at::Tensor& scores,
                               const at::Tensor& experts, const std::optional<at::Tensor>& logits,
                               int64_t num_experts, int64_t mode);

// router_backward_rows(Tensor d_score_partial, Tensor rev_idx, Tensor scores, Tensor experts, int num_experts,
//                      int mode) -> (d_logits (T, E) bf16, d_logit_rows (rows) fp32); modes 0 and 2
std::tuple<at::Tensor, at::Tensor> router_backward_rows_cuda(const at::Tensor& d_score_partial,
                                                             const at::Tensor& rev_idx, const at::Tensor& scores,
                                                             const at::Tensor& experts, int64_t num_experts,
                                                             int64_t mode);
std::tuple<at::Tensor, at::Tensor> router_backward_rows_cpu(const at::Tensor& d_score_partial,
                                                            const at::Tensor& rev_idx, const at::Tensor& scores,
                                                            const at::Tensor& experts, int64_t num_experts,
                                                            int64_t mode);

// rounding_probs(Tensor logits, int top_k, bool write_probs) -> (probs, probs_t, chosen_t)
std::tuple<at::Tensor, at::Tensor, at::Tensor> rounding_probs_cuda(const at::Tensor& logits, int64_t top_k,
                                                                   bool write_probs);
std::tuple<at::Tensor, at::Tensor, at::Tensor> rounding_probs_cpu(const at::Tensor& logits, int64_t top_k,
                                                                  bool write_probs);

// routing_metadata(Tensor experts, int num_experts) -> (expert_offsets, gather_idx, rev_idx)
std::tuple<at::Tensor, at::Tensor, at::Tensor> routing_metadata_cuda(const at::Tensor& experts,
                                                                     int64_t num_experts);
std::tuple<at::Tensor, at::Tensor, at::Tensor> routing_metadata_cpu(const at::Tensor& experts,
                                                                    int64_t num_experts);

// combine_csr(Tensor y, Tensor row_scores, Tensor rows, Tensor token_offsets) -> Tensor
at::Tensor combine_csr_cuda(const at::Tensor& y, const at::Tensor& row_scores, const at::Tensor& rows,
                            const at::Tensor& token_offsets);
at::Tensor combine_csr_cpu(const at::Tensor& y, const at::Tensor& row_scores, const at::Tensor& rows,
                           const at::Tensor& token_offsets);

}  // namespace sonicmoe::torch_ops
