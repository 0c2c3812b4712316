// The only place torch meets the kernel library: op schemas and their implementations.
#include <Python.h>
#include <torch/library.h>

#include <cstdint>
#include <vector>

#include "host/autotune.h"
#include "sonicmoe.h"
#include "torch/ops.h"

// Importing sonicmoe._C registers the ops below; the module itself has no Python functions.
extern "C" PyObject* PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module);
}

TORCH_LIBRARY(sonicmoe, m) {
  // K2 of docs/design.md §4: out[r] = a[r] @ b[e]^T for rows r of expert e (varlen-M grouped GEMM).
  // partial_rows: expert_offsets[E] may stop short of m_total; rows past it are not written.
  m.def("grouped_gemm(Tensor a, Tensor b, Tensor expert_offsets, int tile_config=0, "
        "bool partial_rows=False) -> Tensor");
  // K1: h[r] = w1[e] @ x[gather_idx[r]], a[r] = act(h[r, :n]) * h[r, n:] (gather and the gated
  // activation fused into the GEMM; activation a GluActivation: 0 SwiGLU, 1 GeGLU, 2 ReGLU); h
  // has 0 rows when keep_h is false.
  m.def("up_proj(Tensor x, Tensor w1, Tensor expert_offsets, Tensor gather_idx, bool keep_h=True, "
        "bool partial_rows=False, int tile_config=0, int activation=0) -> (Tensor, Tensor)");
  // R: top-K scores (fp32) and expert ids (int32) from router logits; mode is a RouterMode.
  m.def("router_topk(Tensor logits, int top_k, int mode) -> (Tensor, Tensor)");
  // Token rounding's router: softmax over all E (fp32) and the top-K choice, expert-major
  // (probs_t (E, T), chosen_t (E, T) bool); probs (T, E) has 0 rows unless write_probs.
  m.def("rounding_probs(Tensor logits, int top_k, bool write_probs) -> (Tensor, Tensor, Tensor)");
  // R: sorted-layout metadata (expert_offsets, gather_idx, rev_idx) of (T, K) expert ids.
  m.def("routing_metadata(Tensor experts, int num_experts) -> (Tensor, Tensor, Tensor)");
  // K6: out[r] = a[r] @ b[e] with b (E, k, n_out) (dX~ = dH @ w1), on the varlen kernel; with the
  // addend, + addend_scale[r] * addend_rows[e] (the router's part of dx folded in).
  m.def("grouped_gemm_kn(Tensor a, Tensor b, Tensor expert_offsets, bool partial_rows=False, "
        "int tile_config=0, Tensor? addend_scale=None, Tensor? addend_rows=None) -> Tensor");
  // K4: backward through the down-projection and the gated activation (K1's) from H (see sonicmoe.h).
  m.def("down_proj_grad(Tensor d_out, Tensor w2, Tensor h, Tensor row_score, Tensor expert_offsets, "
        "Tensor gather_idx, bool partial_rows=False, int tile_config=0, int activation=0) "
        "-> (Tensor, Tensor, Tensor)");
  // K5 / K7: out[e] = sum over rows r of e of a_row(r)^T b_row(r), the gathered operand's row r
  // being its row gather_idx[r] (a's when gather_a); see WeightGradParams in sonicmoe.h. The
  // persistent grid leaves sm_margin SMs to work on other streams; rows_past_end_zeroed: the
  // caller guarantees the rows a cooperative tile reads past expert_offsets[E] (auto may take one).
  m.def("weight_grad(Tensor a, Tensor b, Tensor expert_offsets, Tensor gather_idx, bool gather_a, "
        "bool partial_rows=False, int tile_config=0, int sm_margin=0, bool rows_past_end_zeroed=False) -> Tensor");
  // Token rounding on the device (expert-major (E, T) tensors): the rounded assignment, and the
  // sorted layout of a dense assignment (see TokenRoundingParams, DenseLayoutParams).
  m.def("token_rounding_assign(Tensor probs_t, Tensor chosen_t, int tile, int rule) -> (Tensor, Tensor)");
  // row_bound is a SymInt: it follows from T, and an int would pin a compiled graph to one T.
  m.def("dense_layout(Tensor assigned_t, Tensor scores_t, SymInt row_bound) "
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  // K3: out[t] = sum_k scores[t,k] * y[rev_idx[t,k]] (deterministic gather-and-sum).
  m.def("combine(Tensor y, Tensor scores, Tensor rev_idx) -> Tensor");
  // R's backward: d_logits (T, E) bf16 from K4's score slots (logits: softmax_topk's only).
  m.def("router_backward(Tensor d_score_partial, Tensor rev_idx, Tensor scores, Tensor experts, Tensor? logits, "
        "int num_experts, int mode) -> Tensor");
  // The same for modes 0 and 2 (d_logits zero off the chosen experts), with d_logits at each (t, k)'s
  // sorted row too, fp32 (K6's addend_scale).
  m.def("router_backward_rows(Tensor d_score_partial, Tensor rev_idx, Tensor scores, Tensor experts, "
        "int num_experts, int mode) -> (Tensor, Tensor)");
  // K8: dx[t] = addend[t] + sum_k dx_rows[rev_idx[t,k]] (addend: the router's part of dx, optional).
  m.def("combine_dx(Tensor dx_rows, Tensor rev_idx, Tensor? addend=None) -> Tensor");
  // K3 with a variable number of rows per token (token rounding), CSR by token.
  m.def("combine_csr(Tensor y, Tensor row_scores, Tensor rows, Tensor token_offsets) -> Tensor");
  // out[rev_idx[t,k]] = x[t]: dW1's copy of x in the sorted layout, each row of x read once.
  m.def("scatter_rows(Tensor x, Tensor rev_idx) -> Tensor");
  // The tile autotuner (csrc/host/autotune.h): the current device's cache file ("" for none), and
  // forgetting the choices held in memory (the next call of each class reads the file again).
  m.def("autotune_cache_path() -> str", [] { return sonicmoe::autotune::cache_path(); });
  m.def("autotune_clear() -> ()", [] { sonicmoe::autotune::clear_memory(); });
  // The kernel archs the library was built for (SONICMOE_CUDA_ARCHS): 90 for sm_90a, 100 for sm_100a.
  m.def("kernel_archs() -> int[]", [] {
    const sonicmoe::BuiltArchs built = sonicmoe::built_archs();
    std::vector<int64_t> archs;
    if (built.sm90) archs.push_back(90);
    if (built.sm100) archs.push_back(100);
    return archs;
  });
}

TORCH_LIBRARY_IMPL(sonicmoe, CUDA, m) {
  m.impl("grouped_gemm", &sonicmoe::torch_ops::grouped_gemm_cuda);
  m.impl("up_proj", &sonicmoe::torch_ops::up_proj_cuda);
  m.impl("combine", &sonicmoe::torch_ops::combine_cuda);
  m.impl("router_topk", &sonicmoe::torch_ops::router_topk_cuda);
  m.impl("rounding_probs", &sonicmoe::torch_ops::rounding_probs_cuda);
  m.impl("routing_metadata", &sonicmoe::torch_ops::routing_metadata_cuda);
  m.impl("token_rounding_assign", &sonicmoe::torch_ops::token_rounding_assign_cuda);
  m.impl("dense_layout", &sonicmoe::torch_ops::dense_layout_cuda);
  m.impl("grouped_gemm_kn", &sonicmoe::torch_ops::grouped_gemm_kn_cuda);
  m.impl("down_proj_grad", &sonicmoe::torch_ops::down_proj_grad_cuda);
  m.impl("weight_grad", &sonicmoe::torch_ops::weight_grad_cuda);
  m.impl("combine_csr", &sonicmoe::torch_ops::combine_csr_cuda);
  m.impl("combine_dx", &sonicmoe::torch_ops::combine_dx_cuda);
  m.impl("scatter_rows", &sonicmoe::torch_ops::scatter_rows_cuda);
  m.impl("router_backward", &sonicmoe::torch_ops::router_backward_cuda);
  m.impl("router_backward_rows", &sonicmoe::torch_ops::router_backward_rows_cuda);
}

TORCH_LIBRARY_IMPL(sonicmoe, CPU, m) {
  m.impl("grouped_gemm", &sonicmoe::torch_ops::grouped_gemm_cpu);
  m.impl("up_proj", &sonicmoe::torch_ops::up_proj_cpu);
  m.impl("combine", &sonicmoe::torch_ops::combine_cpu);
  m.impl("router_topk", &sonicmoe::torch_ops::router_topk_cpu);
  m.impl("rounding_probs", &sonicmoe::torch_ops::rounding_probs_cpu);
  m.impl("routing_metadata", &sonicmoe::torch_ops::routing_metadata_cpu);
  m.impl("token_rounding_assign", &sonicmoe::torch_ops::token_rounding_assign_cpu);
  m.impl("dense_layout", &sonicmoe::torch_ops::dense_layout_cpu);
  m.impl("grouped_gemm_kn", &sonicmoe::torch_ops::grouped_gemm_kn_cpu);
  m.impl("down_proj_grad", &sonicmoe::torch_ops::down_proj_grad_cpu);
  m.impl("weight_grad", &sonicmoe::torch_ops::weight_grad_cpu);
  m.impl("combine_csr", &sonicmoe::torch_ops::combine_csr_cpu);
  m.impl("combine_dx", &sonicmoe::torch_ops::combine_dx_cpu);
  m.impl("scatter_rows", &sonicmoe::torch_ops::scatter_rows_cpu);
  m.impl("router_backward", &sonicmoe::torch_ops::router_backward_cpu);
  m.impl("router_backward_rows", &sonicmoe::torch_ops::router_backward_rows_cpu);
}
