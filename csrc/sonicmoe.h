// SonicMoE kernel library: torch-free C++ API.
//
// Plain parameter structs (pointers, sizes, stream) and run_* entry points. The torch layer
// (csrc/torch/) validates tensors, allocates outputs and workspace, then calls these.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace sonicmoe {

// Result of a host entry point: empty message on success.
struct Status {
  std::string message;
  bool ok() const { return message.empty(); }
  static Status success() { return {}; }
  static Status error(std::string msg) { return {std::move(msg)}; }
};

// The GPU families the kernels are built for. An arch-specific target ('a') loads only on its
// exact compute capability: sm_90a on 9.0 (H100, H200), sm_100a on 10.0 (B200, GB200), not on
// 10.3 (B300, sm_103) or 12.x.
enum class KernelArch : int { kNone = 0, kSm90 = 90, kSm100 = 100 };

// The archs this library holds kernels for (SONICMOE_CUDA_ARCHS at build time).
struct BuiltArchs {
  bool sm90 = false;
  bool sm100 = false;
};
BuiltArchs built_archs();

// The kernel family of a compute capability: 90 for 9.0, 100 for 10.0, else 0 (none).
constexpr int arch_family(int major, int minor) {
  return major == 9 && minor == 0 ? 90 : major == 10 && minor == 0 ? 100 : 0;
}
// arch_family of a CUDA device's compute capability; 0 when the query fails.
int device_arch(int device);

// Which kernels op runs on a GPU of compute capability major.minor, given the archs built (every
// op has sm_90a and sm_100a kernels): the family, or kNone with a message that names the GPU, the
// build and what to do. Pure: no device access.
struct KernelArchChoice {
  KernelArch arch = KernelArch::kNone;
  std::string error;
};
KernelArchChoice choose_kernel_arch(const char* op, int major, int minor, BuiltArchs built);
// The same for a CUDA device of this build (queries its compute capability).
KernelArchChoice device_kernel_arch(const char* op, int device);

// Tile configurations of the sm90 grouped GEMM (csrc/common/tile_size.h spells them out).
// kAuto lets the heuristic (csrc/sm90/heuristics.h) choose from the problem shape.
enum class GemmTileConfig : int {
  kAuto = 0,
  kPingpong128x128x64 = 1,
  kPingpong64x128x128 = 2,
  kCooperative128x256x64 = 3,
  kCooperative256x128x64 = 4,
  kPingpong128x128x128 = 5,
  kPingpong128x128x64C1x1 = 6,
  // Our own varlen kernel (csrc/sm90/varlen_gemm_kernel_sm90.cuh): one TMA descriptor per
  // tensor and a scheduler reading expert_offsets, instead of CUTLASS's ptr-array grouped GEMM.
  kVarlenPingpong128x128x64 = 7,
  // The varlen kernel with both consumer warpgroups on one tile: 128 x 256 (64 rows each; a
  // gathered A row serves 256 output columns) or 256 x 128 (128 rows each).
  kVarlenCooperative128x256x64 = 8,
  kVarlenCooperative256x128x64 = 9,
  // The 128 x 256 one in 2 x 1 clusters: the CTAs of a cluster run consecutive tiles and share
  // B by TMA multicast where both need the same B (K1, K2, K4, K6; not the weight gradients).
  kVarlenCooperative128x256x64C2x1 = 10,
  // The ping-pong 128 x 128 tile in 2 x 1 clusters sharing B by multicast (upstream's dH tile):
  // each CTA's two consumer warpgroups take alternate pairs, the same parity in both CTAs.
  kVarlenPingpong128x128x64C2x1 = 11,
  // grouped_gemm only (K2, b_layout NK, and K6, b_layout KN): a ping-pong warpgroup owns a
  // 128 x 192 tile (192 fp32 accumulators a thread), for short K loops (the down-projection at
  // n < 1024, dX~ = dH @ w1 over k = 2n) where the tile's stores weigh and ping-pong hides them;
  // 64-column B boxes, which K1's gate / up halves of 96 columns do not fit.
  kVarlenPingpong128x192x64 = 12,
};
constexpr int kNumGemmTileConfigs = 13;  // including kAuto

// The varlen kernel's configurations that every varlen op takes (K1 runs on these only).
constexpr bool is_varlen_config(GemmTileConfig c) {
  return c == GemmTileConfig::kVarlenPingpong128x128x64 || c == GemmTileConfig::kVarlenCooperative128x256x64 ||
         c == GemmTileConfig::kVarlenCooperative128x256x64C2x1 ||
         c == GemmTileConfig::kVarlenCooperative256x128x64 || c == GemmTileConfig::kVarlenPingpong128x128x64C2x1;
}

// The varlen configurations of grouped_gemm alone (K2 and K6, either b_layout; not K1, K4, K5 /
// K7), after every other one.
constexpr bool is_grouped_gemm_only_config(GemmTileConfig c) { return c == GemmTileConfig::kVarlenPingpong128x192x64; }

// The gated activation of K1 / K4: A = act(gate) * up (common/glu_math.cuh).
enum class GluActivation : int {
  kSwiGLU = 0,  // silu (Llama, Mixtral, Qwen, DeepSeek, OLMoE)
  kGeGLU = 1,   // GELU, tanh form (torch.nn.functional.gelu(approximate="tanh"))
  kReGLU = 2,   // ReLU
};
constexpr int kNumGluActivations = 3;

// How the grouped GEMM's per-expert matrix b[e] is stored.
enum class WeightLayout : int {
  kNK = 0,  // b (num_experts, n_out, k), k contiguous: out = a @ b[e]^T (the w2 layout: K2)
  kKN = 1,  // b (num_experts, k, n_out), n_out contiguous: out = a @ b[e] (dH @ w1: K6)
};

// The varlen problem every grouped GEMM of the library shares: m_total rows sorted by expert,
// expert e owning rows [expert_offsets[e], expert_offsets[e+1]), computed by a persistent grid
// on params.stream. Each op's params struct derives from it (or from GatheredVarlenProblem) and
// adds its tensors and sizes; fields are set by name.
struct VarlenProblem {
  const int32_t* expert_offsets = nullptr;  // (num_experts + 1) int32, device memory
  int64_t m_total = 0;                      // sorted rows
  int num_experts = 0;
  int sm_count = 0;                         // SMs the persistent grid may use
  // expert_offsets[E] may stop short of m_total (routing whose row count is known only on the
  // device, e.g. token rounding into an upper-bound buffer); rows past it are not written.
  // Varlen kernel only (kAuto picks it).
  bool partial_rows = false;
  // kAuto lets the op's heuristic choose (csrc/sm90/heuristics.h); which others an op takes is
  // written at its params struct.
  GemmTileConfig config = GemmTileConfig::kAuto;
  cudaStream_t stream = nullptr;
};

// A varlen problem with one operand gathered inside the GEMM's loads (no gathered copy): sorted
// row r reads row gather_idx[r] of a (num_tokens, ...) source.
struct GatheredVarlenProblem : VarlenProblem {
  const int32_t* gather_idx = nullptr;  // (m_total), sorted row -> token, device
  int64_t num_tokens = 0;
};

// Varlen-M grouped GEMM (K2 of docs/design.md §4):
//   out[r, :] = a[r, :] @ b[e]^T   for every row r in [expert_offsets[e], expert_offsets[e+1]).
// All tensors are row-major and contiguous; bf16 in, fp32 accumulate, bf16 out.
// config: any GemmTileConfig (b_layout kKN and partial_rows: kAuto or a varlen one). On an
// sm_100 GPU (cc 10.0, a build with 100a; either b_layout, kKN with or without the addend): kAuto
// only, and kAuto picks an sm100 kernel by sm100/heuristics.h (partial_rows: the rows past
// expert_offsets[E] belong to no group of its ptr-array kernel).
struct GroupedGemmParams : VarlenProblem {
  const void* a = nullptr;                  // (m_total, k) bf16, rows sorted by expert
  const void* b = nullptr;                  // (num_experts, n_out, k) bf16 (the w2 layout)
  void* out = nullptr;                      // (m_total, n_out) bf16
  int64_t n_out = 0;
  int64_t k = 0;
  void* workspace = nullptr;                // device memory, grouped_gemm_workspace_size() bytes
  size_t workspace_bytes = 0;
  WeightLayout b_layout = WeightLayout::kNK;  // kKN on sm90: varlen kernel only (kAuto picks it)
  // kKN only (K6), both or neither: out[r] += addend_scale[r] * addend_rows[e] for the rows r of
  // expert e, added to the fp32 accumulators before the one bf16 rounding (the router's part of
  // dx where d_logits is zero off the chosen experts: d_logits[t, e] * router_weight[e]).
  const float* addend_scale = nullptr;  // (m_total) fp32
  const void* addend_rows = nullptr;    // (num_experts, n_out) bf16, 16-byte aligned
};

// Shape rules of the grouped GEMM (sizes and config only, no pointers), checked on the host.
// Returns "" when the shape is supported, otherwise a message naming the argument, its value
// and the rule. run_grouped_gemm() applies them too, plus non-null and 16-byte-aligned pointers.
std::string check_grouped_gemm(const GroupedGemmParams& params);

// Device workspace the grouped GEMM needs: per-expert problem shapes, pointers and strides
// (built on the device from expert_offsets) plus CUTLASS's own workspace.
size_t grouped_gemm_workspace_size(int num_experts, int sm_count);

// The tile configuration kAuto resolves to for this shape on an sm_90 GPU (sm100 picks among its
// own kernels: sm100/heuristics.h).
GemmTileConfig choose_grouped_gemm_config(int64_t m_total, int64_t n_out, int64_t k,
                                          int num_experts);

// Enqueues the grouped GEMM on params.stream. No host synchronisation; expert_offsets is only
// read on the device. Invalid offsets (not starting at 0, decreasing, not ending at m_total)
// stop the kernel with a device-side trap rather than reading out of bounds.
Status run_grouped_gemm(const GroupedGemmParams& params);

// Up-projection with a gated activation (K1 of docs/design.md §4), for rows r of the sorted
// layout in expert e (act: params.activation, silu for SwiGLU):
//   h[r, :] = w1[e] @ x[gather_idx[r], :]            (2n: gate then up, fp32 accumulate)
//   a[r, :] = act(h[r, :n]) * h[r, n:]               (computed from the fp32 h)
// x rows are gathered inside the GEMM's A load (no gathered copy of x), and w1 is read in its
// public (E, 2n, d) layout. All tensors row-major, contiguous, bf16.
// gather_idx gathers x. config: kAuto or a varlen configuration (is_varlen_config); kAuto:
// sm90/heuristics.h (choose_up_proj_config). On an sm_100 GPU (cc 10.0, a build with 100a): kAuto
// only, which picks the sm100 kernel by sm100/heuristics.h.
struct UpProjParams : GatheredVarlenProblem {
  const void* x = nullptr;                  // (num_tokens, d)
  const void* w1 = nullptr;                 // (num_experts, 2n, d)
  // (m_total, 2n) in H's column order (common/h_column_order.h), or nullptr to not keep H
  void* h = nullptr;
  void* a = nullptr;                        // (m_total, n)
  int64_t d = 0;
  int64_t n = 0;
  GluActivation activation = GluActivation::kSwiGLU;
};

// Shape rules of the up-projection (no pointers); "" when supported.
std::string check_up_proj(const UpProjParams& params);

// Enqueues the up-projection on params.stream. Invalid expert_offsets or a gather_idx entry
// outside [0, num_tokens) stop the kernel with a device-side trap.
Status run_up_proj(const UpProjParams& params);

// Backward through the down-projection and SwiGLU (K4 of docs/design.md §4), for rows r of expert e:
//   dA'[r] = w2[e]^T @ d_out[gather_idx[r]]   (n, fp32; d_out rows gathered in the A load)
//   A = act(gate) * up from h[r], s = row_score[r], dA = s * dA'   (act: params.activation)
//   d_h[r] = [dA * up * act'(gate), dA * act(gate)],  a_scaled[r] = s * A  (bf16)
//   d_score_partial[r, j] = sum of dA' * A over n columns [128 j, 128 j + 128)  (fp32)
// gather_idx gathers d_out. config as in UpProjParams (kAuto: choose_down_proj_grad_config).
// With partial_rows, d_h and a_scaled are also zeroed on their first kRowsZeroedPastEnd rows past
// expert_offsets[E] (see run_zero_rows_past_end).
struct DownProjGradParams : GatheredVarlenProblem {
  const void* d_out = nullptr;              // (num_tokens, d) bf16
  const void* w2 = nullptr;                 // (num_experts, d, n) bf16
  const void* h = nullptr;                  // (m_total, 2n) bf16, kept by the up-projection (in its column order)
  const float* row_score = nullptr;         // (m_total) fp32
  void* d_h = nullptr;                      // (m_total, 2n) bf16
  void* a_scaled = nullptr;                 // (m_total, n) bf16
  float* d_score_partial = nullptr;         // (m_total, ceil(n / 128)) fp32
  int64_t d = 0;
  int64_t n = 0;
  GluActivation activation = GluActivation::kSwiGLU;  // K1's, which made h
};
constexpr int kDownProjGradBlockCols = 128;  // n columns per d_score_partial slot
std::string check_down_proj_grad(const DownProjGradParams& params);
Status run_down_proj_grad(const DownProjGradParams& params);

// Upper-bound buffers (partial_rows) are not written past expert_offsets[E]; a varlen-K tile that
// loads whole 64-row boxes by TMA reads up to 63 rows past the last expert's end, multiplied by
// zeros, which must therefore be finite. run_zero_rows_past_end zeroes rows [end, end + count)
// (at most rows) of each row-major (rows, row_bytes) buffer, end = *end_row read on the device,
// all of them in one launch.
constexpr int kRowsZeroedPastEnd = 64;
struct RowMajorBuffer {
  void* data = nullptr;
  int64_t row_bytes = 0;
};
constexpr int kMaxBuffersZeroedPastEnd = 2;
Status run_zero_rows_past_end(const int32_t* end_row, int64_t rows, int count,
                              std::initializer_list<RowMajorBuffer> buffers, cudaStream_t stream);

// Expert weight gradients (K5 and K7 of docs/design.md §4), varlen-K grouped GEMMs: for each expert e,
//   out[e] = sum over the sorted rows r of e of  a_row(r)^T b_row(r)   (m_out x n_out, fp32
//   accumulate, bf16 out)
// where the gathered operand's row r is its row gather_idx[r] and the other's is its row r:
//   gather_a: a (num_tokens, m_out), b (m_total, n_out)   K5: dW2 = dO[gather]^T A'
//   else:     a (m_total, m_out), b (num_tokens, n_out)   K7: dW1 = dH^T x[gather]
// The gather runs inside the loads (no gathered copy). An expert with no rows gets exact zeros.
// config (VarlenProblem::config), with partial_rows as in VarlenProblem:
//   kVarlenPingpong128x128x64; or cooperative with the gathered side 128 wide:
//   kVarlenCooperative128x256x64 when gather_a, kVarlenCooperative256x128x64 otherwise, either
//   in 2 x 1 clusters as kVarlenCooperative128x256x64C2x1; kAuto: sm90::choose_weight_grad_config
//   (ping-pong with partial_rows, unless rows_past_end_zeroed). A cooperative tile reads its
//   other operand by TMA in whole 64-row boxes, so with partial_rows that operand's first
//   kRowsZeroedPastEnd rows past expert_offsets[E] must be finite (down_proj_grad zeroes them in
//   its outputs); they meet zero-filled rows of the gathered operand.
struct WeightGradParams : GatheredVarlenProblem {
  const void* a = nullptr;
  const void* b = nullptr;
  void* out = nullptr;                      // (num_experts, m_out, n_out) bf16
  int64_t m_out = 0;
  int64_t n_out = 0;
  bool gather_a = true;
  // The caller guarantees those rows finite (the layer passes down_proj_grad's outputs): kAuto
  // then chooses by the shape alone, partial_rows or not.
  bool rows_past_end_zeroed = false;
};
std::string check_weight_grad(const WeightGradParams& params);
Status run_weight_grad(const WeightGradParams& params);

// Combine (K3 of docs/design.md §4): out[t, :] = sum_k scores[t, k] * y[rev_idx[t, k], :].
// Deterministic (a fixed summation order, no atomics), fp32 accumulation, bf16 out.
struct CombineParams {
  const void* y = nullptr;              // (num_rows, d) bf16, the sorted layout
  const float* scores = nullptr;        // (num_tokens, top_k) fp32
  const int32_t* rev_idx = nullptr;     // (num_tokens, top_k) int32, (t, k) -> row of y
  void* out = nullptr;                  // (num_tokens, d) bf16
  int64_t num_tokens = 0;
  int top_k = 0;
  int64_t d = 0;
  int64_t num_rows = 0;
  cudaStream_t stream = nullptr;
};

// K8 (docs/design.md §4): dx[t, :] = addend[t, :] + sum_k dx_rows[rev_idx[t, k], :], addend optional (the
// router's part of dx, d_logits @ router_weight). Deterministic, fp32 sums, one bf16 rounding.
struct CombineDxParams {
  const void* dx_rows = nullptr;     // (num_rows, d) bf16, the sorted layout (K6's dX~)
  const int32_t* rev_idx = nullptr;  // (num_tokens, top_k) int32, (t, k) -> row of dx_rows
  const void* addend = nullptr;      // (num_tokens, d) bf16, or nullptr
  void* out = nullptr;               // (num_tokens, d) bf16
  int64_t num_tokens = 0;
  int top_k = 0;
  int64_t d = 0;
  int64_t num_rows = 0;
  cudaStream_t stream = nullptr;
};
std::string check_combine_dx(const CombineDxParams& params);
// A rev_idx entry outside [0, num_rows) stops the kernel with a device-side trap.
Status run_combine_dx(const CombineDxParams& params);

// The inverse move (dW1's copy of x in the sorted layout, docs/design.md §4): out[rev_idx[t, k], :] =
// x[t, :] for every (t, k), each row of x read once. rev_idx is a permutation of [0, num_tokens *
// top_k) (routing_metadata's): every row of out written once.
struct ScatterRowsParams {
  const void* x = nullptr;           // (num_tokens, d) bf16
  const int32_t* rev_idx = nullptr;  // (num_tokens, top_k) int32, (t, k) -> row of out
  void* out = nullptr;               // (num_tokens * top_k, d) bf16
  int64_t num_tokens = 0;
  int top_k = 0;
  int64_t d = 0;
  cudaStream_t stream = nullptr;
};
std::string check_scatter_rows(const ScatterRowsParams& params);
// A rev_idx entry outside [0, num_tokens * top_k) stops the kernel with a device-side trap.
Status run_scatter_rows(const ScatterRowsParams& params);

// Combine with a variable number of rows per token (token rounding): out[t, :] =
// sum over j in [token_offsets[t], token_offsets[t+1]) of row_scores[j] * y[rows[j], :], in order.
struct CombineCsrParams {
  const void* y = nullptr;                 // (num_rows, d) bf16
  const float* row_scores = nullptr;       // (>= token_offsets[T]) fp32
  const int32_t* rows = nullptr;           // (>= token_offsets[T]) int32, rows of y
  const int32_t* token_offsets = nullptr;  // (num_tokens + 1) int32, non-decreasing
  void* out = nullptr;                     // (num_tokens, d) bf16
  int64_t num_tokens = 0;
  int64_t d = 0;
  int64_t num_rows = 0;
  cudaStream_t stream = nullptr;
};
std::string check_combine_csr(const CombineCsrParams& params);
Status run_combine_csr(const CombineCsrParams& params);

// Shape rules of combine (no pointers); "" when supported.
std::string check_combine(const CombineParams& params);

// Enqueues combine on params.stream. A rev_idx entry outside [0, num_rows) stops the kernel
// with a device-side trap instead of reading out of bounds.
Status run_combine(const CombineParams& params);

// Routing R (docs/design.md §4). Router top-K: scores[t, k] and experts[t, k] (by decreasing logit,
// ties to the lower expert id) from logits (T, E), fp32 or bf16.
enum class RouterMode : int {
  kTopkSoftmax = 0,      // softmax over the K largest logits (Mixtral)
  kSoftmaxTopk = 1,      // softmax over all E, keep the K largest (OLMoE)
  kSoftmaxTopkNorm = 2,  // the same, renormalised over the K (Qwen3)
};
constexpr int kMaxRouterExperts = 1024;  // one warp holds a token's logits in registers
constexpr int kMaxRouterTopK = 32;       // lane k keeps choice k
constexpr int kRoutingChunkTokens = 32;  // tokens per chunk of the sorted-layout kernels

struct RouterTopkParams {
  const void* logits = nullptr;  // (num_tokens, num_experts), row-major
  bool logits_bf16 = false;      // else fp32
  int64_t num_tokens = 0;
  int num_experts = 0;
  int top_k = 0;
  int mode = 0;                  // a RouterMode
  float* scores = nullptr;       // (num_tokens, top_k)
  int32_t* experts = nullptr;    // (num_tokens, top_k)
  cudaStream_t stream = nullptr;
};
std::string check_router_topk(const RouterTopkParams& params);
Status run_router_topk(const RouterTopkParams& params);

// R's backward for sonicmoe.moe's top-K layer: d_logits (T, E) bf16 from the score gradients of
// each token's K rows, dS_k = the sum of K4's slots d_score_partial[rev_idx[t, k], :] in order.
// With w_k = dS_k s_k and W = sum_k w_k: softmax_topk gives w_k at the chosen experts minus
// p_e W at every expert (p the softmax of the logits over E); the modes over the K chosen give
// w_k - s_k W at the chosen experts and 0 elsewhere. fp32 throughout, one bf16 rounding.
struct RouterBackwardParams {
  const float* d_score_partial = nullptr;  // (num_rows, slots) fp32
  int slots = 0;
  const int32_t* rev_idx = nullptr;        // (num_tokens, top_k): (t, k) -> row
  const float* scores = nullptr;           // (num_tokens, top_k) R's scores
  const int32_t* experts = nullptr;        // (num_tokens, top_k) R's choices
  const void* logits = nullptr;            // (num_tokens, num_experts): softmax_topk's only, else unread
  bool logits_bf16 = false;                // else fp32
  int64_t num_tokens = 0;
  int num_experts = 0;
  int top_k = 0;
  int64_t num_rows = 0;
  int mode = 0;                            // a RouterMode
  void* d_logits = nullptr;                // (num_tokens, num_experts) bf16 out
  // (num_rows) fp32 out, or nullptr: d_logit_rows[rev_idx[t, k]] = d_logits[t, experts[t, k]] before
  // its bf16 rounding, for the modes whose d_logits is zero off the chosen experts (not softmax_topk).
  float* d_logit_rows = nullptr;
  cudaStream_t stream = nullptr;
};
std::string check_router_backward(const RouterBackwardParams& params);
// A rev_idx entry outside [0, num_rows) or an expert outside [0, num_experts) stops the kernel
// with a device-side trap.
Status run_router_backward(const RouterBackwardParams& params);

// Token rounding's probabilities (docs/design.md §6): the softmax over all E in fp32 of logits (T, E),
// fp32 or bf16, with the top-K choice of R (ties to the lower expert id), written expert-major
// for the rounding kernels: probs_t (E, T) fp32 and chosen_t (E, T) bool; and row-major probs
// (T, E) fp32 when non-null. Limits of R: E <= kMaxRouterExperts, K <= min(E, kMaxRouterTopK).
struct RoundingProbsParams {
  const void* logits = nullptr;  // (num_tokens, num_experts), row-major
  bool logits_bf16 = false;      // else fp32
  int64_t num_tokens = 0;
  int num_experts = 0;
  int top_k = 0;
  float* probs = nullptr;        // (num_tokens, num_experts) or null
  float* probs_t = nullptr;      // (num_experts, num_tokens)
  uint8_t* chosen_t = nullptr;   // (num_experts, num_tokens), 0 / 1
  cudaStream_t stream = nullptr;
};
std::string check_rounding_probs(const RoundingProbsParams& params);
Status run_rounding_probs(const RoundingProbsParams& params);

// Sorted-layout metadata of (T, K) expert ids: expert_offsets (E+1), gather_idx (T*K, row ->
// token) and rev_idx (T*K, (t, k) -> row); rows of an expert in (t, k) order. Three launches,
// integer counts only (deterministic), no host sync; an id outside [0, E) traps on the device.
struct SortedLayoutParams {
  const void* experts = nullptr;  // (num_tokens, top_k), int32 or int64
  bool experts_int64 = false;
  int64_t num_tokens = 0;
  int top_k = 0;
  int num_experts = 0;
  int32_t* expert_offsets = nullptr;
  int32_t* gather_idx = nullptr;
  int32_t* rev_idx = nullptr;
  void* workspace = nullptr;      // sorted_layout_workspace_size() bytes, device
  size_t workspace_bytes = 0;
  cudaStream_t stream = nullptr;
};
std::string check_sorted_layout(const SortedLayoutParams& params);
size_t sorted_layout_workspace_size(int64_t num_tokens, int num_experts);
Status run_sorted_layout(const SortedLayoutParams& params);

// Token rounding (docs/design.md §6): from the top-K choice, each expert's token count is rounded to a
// multiple of tile by rule (0 nearest, ties up; 1 up; 2 down; capped at num_tokens) by flipping
// fewer than tile tokens: its best unchosen ones by probability (ties to the lower token) or its
// worst chosen ones (ties: the higher token first). One block per expert, no host sync; the
// same assignment as sonicmoe.routing.token_rounding. Expert-major (E, T) buffers.
struct TokenRoundingParams {
  const float* probs_t = nullptr;     // (num_experts, num_tokens) softmax probabilities
  const uint8_t* chosen_t = nullptr;  // (num_experts, num_tokens) top-K choice, 0 or 1
  uint8_t* assigned_t = nullptr;      // (num_experts, num_tokens) out: the rounded assignment
  int32_t* counts = nullptr;          // (num_experts) out: tokens per expert after rounding
  int64_t num_tokens = 0;
  int num_experts = 0;
  int tile = 128;
  int rule = 0;
  cudaStream_t stream = nullptr;
};
std::string check_token_rounding(const TokenRoundingParams& params);
Status run_token_rounding_assign(const TokenRoundingParams& params);

// Sorted layout of a dense (E, T) assignment (token rounding's DenseRoutingMetadata): expert e
// owns rows [expert_offsets[e], expert_offsets[e+1]) holding its tokens in order (gather_idx,
// sorted_scores); token t owns entries [token_offsets[t], token_offsets[t+1]) listing its
// experts in order (rows: the entry's sorted row, row_scores). The four row_bound buffers are
// zero past the M assigned pairs; row_bound must be >= M (pairs past it are not written). Three
// launches, integer counts only, no host sync.
struct DenseLayoutParams {
  const uint8_t* assigned_t = nullptr;  // (num_experts, num_tokens), 0 or 1
  const float* scores_t = nullptr;      // (num_experts, num_tokens)
  int64_t num_tokens = 0;
  int num_experts = 0;
  int32_t* expert_offsets = nullptr;    // (num_experts + 1)
  int32_t* gather_idx = nullptr;        // (row_bound)
  float* sorted_scores = nullptr;       // (row_bound)
  int32_t* token_offsets = nullptr;     // (num_tokens + 1)
  int32_t* rows = nullptr;              // (row_bound)
  float* row_scores = nullptr;          // (row_bound)
  int64_t row_bound = 0;                // the four buffers' length
  void* workspace = nullptr;            // dense_layout_workspace_size() bytes, device
  size_t workspace_bytes = 0;
  cudaStream_t stream = nullptr;
};
std::string check_dense_layout(const DenseLayoutParams& params);
size_t dense_layout_workspace_size(int64_t num_tokens, int num_experts);
Status run_dense_layout(const DenseLayoutParams& params);

}  // namespace sonicmoe
