// Routing R (docs/design.md §4): router top-K with scores, and the sorted-layout metadata, in five small
// launches and no host sync. Plain CUDA, arch-generic.
//
// router_topk: one warp per token holds its E logits in registers (E <= 1024; the kernel is
// instantiated for the number of 32-logit slots E needs, so E 128 does not pay for 1024), picks
// the K largest by K warp arg-max rounds (ties to the lower expert id, so the choice is
// deterministic) and writes fp32 scores by the routing mode.
// sorted layout: tokens are cut into chunks of kRoutingChunkTokens; (1) a per-chunk histogram of
// expert ids, (2) one block per expert scans its counts over the chunks into per-chunk bases and
// its total, (3) one block scans the totals into expert_offsets, (4) each chunk places its
// (token, k) pairs: a pair's row is its expert's offset plus its base in that chunk plus the
// number of earlier pairs of the chunk with the same expert (warp match, warps in order). Rows
// within an expert are therefore in (token, k) order, exactly as a stable sort would give, with
// integer counts only: deterministic.
#include <cub/block/block_scan.cuh>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <climits>
#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>

#include "common/cuda_check.h"
#include "common/host_rules.h"
#include "common/once_per_device.h"
#include "sonicmoe.h"

namespace sonicmoe {
namespace {

constexpr int kTopkWarpsPerBlock = 8;
constexpr int kRoundingTokensPerBlock = 32;  // a warp each; one expert-major row per store
constexpr int kMaxSlots = kMaxRouterExperts / 32;  // logits per lane
constexpr int kScanThreads = 1024;
constexpr int kChunkScanThreads = 256;
static_assert(kMaxRouterExperts <= kScanThreads, "one scan thread per expert");

// rounding_probs_kernel's shared row pitch: odd, so that 32 tokens' entries of one expert fall in
// 32 different banks.
__host__ __device__ constexpr int rounding_rows_pitch(int num_experts) { return num_experts | 1; }

// Floats as unsigned keys of the same order (no NaN): flip every bit of a negative, the sign of
// a positive; -0 counts as +0 (they compare equal). 0 is below every key of a float, -inf
// included (0x007fffff).
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = f == 0.f ? 0u : __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// The per-lane key of logit e. bf16 logits have 16 significant bits, so the low half of the key
// carries 0xffff - e: keys are distinct and the larger one is the larger logit, then the lower
// expert id, and one warp max (redux.sync) finds a round's choice. fp32 keys are the value alone;
// a second warp reduction takes the lowest expert among the lanes holding it.
template <class Logit>
struct TopkKey;
template <>
struct TopkKey<__nv_bfloat16> {
  static constexpr bool kPacked = true;
  static __device__ float load(const __nv_bfloat16* row, int e) { return __bfloat162float(row[e]); }
  static __device__ uint32_t make(float logit, int e) {
    return (order_key(logit) & 0xffff0000u) | uint32_t(0xffff - e);
  }
  // A negative value's key had 0xffff below its 16 bits (the flipped zeros of the bf16 padding).
  static __device__ float value(uint32_t k) {
    const uint32_t high = k & 0xffff0000u;
    return key_value((high & 0x80000000u) ? high : (high | 0xffffu));
  }
};
template <>
struct TopkKey<float> {
  static constexpr bool kPacked = false;
  static __device__ float load(const float* row, int e) { return __ldg(row + e); }
  static __device__ uint32_t make(float logit, int) { return order_key(logit); }
  static __device__ float value(uint32_t k) { return key_value(k); }
};

// A token's top-K: the lanes' keys of its logits row[s * 32 + lane] (0 past num_experts), then
// K rounds of the warp arg-max over them; each round's choice has its key set to 0, so it is
// never chosen again (key ends 0 exactly at the chosen experts and past num_experts). Lane
// k < top_k receives the k-th choice: its logit and expert.
template <class Key, int kSlots, class Logit>
__device__ __forceinline__ void warp_topk(const Logit* row, int num_experts, int top_k, int lane,
                                          uint32_t (&key)[kSlots], float& my_value, int& my_expert) {
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int e = s * 32 + lane;
    key[s] = e < num_experts ? Key::make(Key::load(row, e), e) : 0u;
  }
  for (int k = 0; k < top_k; ++k) {
    uint32_t local = 0;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) local = max(local, key[s]);
    const uint32_t best = __reduce_max_sync(0xffffffffu, local);
    int best_e;
    if constexpr (Key::kPacked) {
      best_e = 0xffff - int(best & 0xffffu);
    } else {
      uint32_t lowest = 0xffffffffu;  // this lane's lowest expert holding the best value
#pragma unroll
      for (int s = kSlots - 1; s >= 0; --s)
        if (key[s] == best) lowest = uint32_t(s * 32 + lane);
      best_e = int(__reduce_min_sync(0xffffffffu, lowest));
    }
    if (lane == k) {
      my_value = Key::value(best);
      my_expert = best_e;
    }
#pragma unroll
    for (int s = 0; s < kSlots; ++s)
      if (s * 32 + lane == best_e) key[s] = 0u;  // taken: never chosen again
  }
}

// kSlots: logits per lane, at least ceil(E / 32). Each of the K rounds is a per-lane max over
// the lane's keys and one (bf16) or two (fp32) warp reductions; v1 compared (value, expert)
// pairs through five shuffle rounds per choice and was issue-bound (ncu: SM 85%, 44.5 us at
// T 32768, E 128, K 8).
template <class Logit, int kSlots>
__global__ void __launch_bounds__(kTopkWarpsPerBlock * 32)
router_topk_kernel(const Logit* __restrict__ logits, int64_t num_tokens, int num_experts, int top_k,
                   int mode, float* __restrict__ scores, int32_t* __restrict__ experts) {
  using Key = TopkKey<Logit>;
  const int lane = threadIdx.x % 32;
  const int64_t t = int64_t(blockIdx.x) * kTopkWarpsPerBlock + threadIdx.x / 32;
  if (t >= num_tokens) return;
  const Logit* row = logits + t * num_experts;

  // K rounds; lane k keeps the k-th choice.
  uint32_t key[kSlots];  // 0: no expert, or already chosen
  float my_value = -INFINITY;
  int my_expert = 0;
  warp_topk<Key>(row, num_experts, top_k, lane, key, my_value, my_expert);

  // Softmax pieces, all relative to the largest logit (the first choice).
  const float top = __shfl_sync(0xffffffffu, my_value, 0);
  const float mine = lane < top_k ? __expf(my_value - top) : 0.f;
  float chosen_sum = mine;
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) chosen_sum += __shfl_xor_sync(0xffffffffu, chosen_sum, offset);
  float denominator = chosen_sum;  // topk_softmax and softmax_topk_norm: over the K chosen
  if (mode == static_cast<int>(RouterMode::kSoftmaxTopk)) {
    float all = 0.f;  // over all E: the chosen (their keys now 0) plus the rest
#pragma unroll
    for (int s = 0; s < kSlots; ++s)
      if (key[s] != 0u) all += __expf(Key::value(key[s]) - top);
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) all += __shfl_xor_sync(0xffffffffu, all, offset);
    denominator = all + chosen_sum;
  }
  if (lane < top_k) {
    scores[t * top_k + lane] = mine / denominator;
    experts[t * top_k + lane] = my_expert;
  }
}

// (1) Per-chunk expert histogram; traps on an expert id outside [0, E).
template <class Index>
__global__ void expert_histogram_kernel(const Index* __restrict__ experts, int64_t num_pairs,
                                        int pairs_per_chunk, int num_experts,
                                        int32_t* __restrict__ chunk_counts) {
  extern __shared__ int32_t counts[];
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  const int64_t i = int64_t(blockIdx.x) * pairs_per_chunk + threadIdx.x;
  if (threadIdx.x < pairs_per_chunk && i < num_pairs) {
    const int64_t e = experts[i];
    if (e < 0 || e >= num_experts) {
      printf("sonicmoe routing: experts[%lld] = %lld is outside [0, %d)\n", static_cast<long long>(i),
             static_cast<long long>(e), num_experts);
      __trap();
    }
    atomicAdd(&counts[e], 1);  // integer: the total does not depend on the order
  }
  __syncthreads();
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x)
    chunk_counts[int64_t(blockIdx.x) * num_experts + e] = counts[e];
}

// (2) One block per expert: the exclusive scan of its counts over the chunks, written over them
// (each chunk's first row within the expert), and the expert's total. v1 ran this and (3) in one
// block, a thread per expert looping over every chunk: 52-62 µs at T 16384 on the H200.
__global__ void __launch_bounds__(kChunkScanThreads)
expert_chunk_scan_kernel(int32_t* __restrict__ chunk_counts, int num_chunks, int num_experts,
                         int32_t* __restrict__ expert_totals) {
  using Scan = cub::BlockScan<int32_t, kChunkScanThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  const int e = blockIdx.x;
  int32_t carry = 0;
  for (int c0 = 0; c0 < num_chunks; c0 += kChunkScanThreads) {
    const int c = c0 + threadIdx.x;
    int32_t* slot = chunk_counts + int64_t(c) * num_experts + e;
    const int32_t count = c < num_chunks ? *slot : 0;
    int32_t before = 0, total = 0;
    Scan(scan_storage).ExclusiveSum(count, before, total);
    if (c < num_chunks) *slot = carry + before;
    carry += total;
    __syncthreads();  // scan_storage is reused
  }
  if (threadIdx.x == 0) expert_totals[e] = carry;
}

// (3) One block: expert_offsets, the exclusive scan of the expert totals.
__global__ void __launch_bounds__(kScanThreads)
expert_offsets_kernel(const int32_t* __restrict__ expert_totals, int num_experts,
                      int32_t* __restrict__ expert_offsets) {
  using Scan = cub::BlockScan<int32_t, kScanThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  const int e = threadIdx.x;
  const int32_t total = e < num_experts ? expert_totals[e] : 0;
  int32_t start = 0, all = 0;
  Scan(scan_storage).ExclusiveSum(total, start, all);
  if (e < num_experts) expert_offsets[e] = start;
  if (e == 0) expert_offsets[num_experts] = all;
}

// (4) Rows of the chunk's pairs; warps take turns so that rows follow (token, k) order.
template <class Index>
__global__ void sorted_layout_kernel(const Index* __restrict__ experts, int64_t num_pairs,
                                     int pairs_per_chunk, int top_k, int num_experts,
                                     const int32_t* __restrict__ chunk_bases,
                                     const int32_t* __restrict__ expert_offsets,
                                     int32_t* __restrict__ gather_idx, int32_t* __restrict__ rev_idx) {
  extern __shared__ int32_t next_row[];
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x)
    next_row[e] = expert_offsets[e] + chunk_bases[int64_t(blockIdx.x) * num_experts + e];
  __syncthreads();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t i = int64_t(blockIdx.x) * pairs_per_chunk + threadIdx.x;
  const bool valid = threadIdx.x < pairs_per_chunk && i < num_pairs;
  const int e = valid ? static_cast<int>(experts[i]) : -1;
  const unsigned same = __match_any_sync(0xffffffffu, e);
  const int rank = __popc(same & ((1u << lane) - 1));
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) {
    if (warp == w && valid) {
      const int32_t row = next_row[e] + rank;
      __syncwarp(same);
      if (rank == 0) next_row[e] += __popc(same);
      gather_idx[row] = static_cast<int32_t>(i / top_k);
      rev_idx[i] = row;
    }
    __syncthreads();
  }
}

// Token rounding's probabilities: per token the softmax over all E in fp32 and its top-K choice
// (warp_topk), written row-major (T, E) when probs is non-null (autograd's copy) and
// expert-major (E, T) for the rounding kernels, with the choice as a bool (E, T). 32 tokens per
// block, one per warp (two where the logits need more than 64 registers: kWarps 16): the warps
// place their rows in shared memory (the sign bit marks a
// chosen pair; probabilities are >= 0), then write experts' rows of the 32 tokens, 128-byte
// stores instead of 4-byte scatters, with nothing pre-zeroed. v1 ran 8 warps of 4 tokens each:
// 80 us at T 16384, E 512, latency-bound (24 warps per SM, each token's loads in series).
template <class Logit, int kSlots, int kWarps>
__global__ void __launch_bounds__(kWarps * 32)
rounding_probs_kernel(const Logit* __restrict__ logits, int64_t num_tokens, int num_experts, int top_k,
                      float* __restrict__ probs, float* __restrict__ probs_t, uint8_t* __restrict__ chosen_t) {
  using Key = TopkKey<Logit>;
  extern __shared__ float token_rows[];  // [kRoundingTokensPerBlock][pitch]
  const int pitch = rounding_rows_pitch(num_experts);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t0 = int64_t(blockIdx.x) * kRoundingTokensPerBlock;
  const int64_t left = num_tokens - t0;
  const int tokens = left < kRoundingTokensPerBlock ? static_cast<int>(left) : kRoundingTokensPerBlock;

  for (int i = warp; i < tokens; i += kWarps) {
    const int64_t t = t0 + i;
    const Logit* row = logits + t * num_experts;
    uint32_t key[kSlots];  // 0: no expert, or chosen
    float my_value = -INFINITY;
    int my_expert = 0;
    warp_topk<Key>(row, num_experts, top_k, lane, key, my_value, my_expert);
    const float top = __shfl_sync(0xffffffffu, my_value, 0);  // the largest logit
    // The row again (L1 hits), twice, rather than a register array of it: 1024 threads leave 64
    // registers per thread.
    float sum = 0.f;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int e = s * 32 + lane;
      if (e < num_experts) sum += expf(Key::load(row, e) - top);
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    const float inverse = 1.f / sum;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int e = s * 32 + lane;
      if (e < num_experts) {
        const float p = expf(Key::load(row, e) - top) * inverse;
        if (probs != nullptr) probs[t * num_experts + e] = p;
        token_rows[i * pitch + e] = key[s] == 0u ? __uint_as_float(__float_as_uint(p) | 0x80000000u) : p;
      }
    }
  }
  __syncthreads();
  // Lane = token: row e of (E, T) gets 32 consecutive tokens; an odd pitch keeps the 32 lanes'
  // shared reads on 32 banks.
  if (lane < tokens) {
    for (int e = warp; e < num_experts; e += kWarps) {
      const uint32_t bits = __float_as_uint(token_rows[lane * pitch + e]);
      probs_t[e * num_tokens + t0 + lane] = __uint_as_float(bits & 0x7fffffffu);
      chosen_t[e * num_tokens + t0 + lane] = uint8_t(bits >> 31);
    }
  }
}

// R's backward (RouterBackwardParams): a warp per token; lane k < K gathers row k's score
// gradient and holds (w_k, s_k, expert_k), which the lanes of each 32 experts take by shuffles.
template <class Logit>
__global__ void __launch_bounds__(kTopkWarpsPerBlock * 32)
router_backward_kernel(const float* __restrict__ d_score_partial, int slots, const int32_t* __restrict__ rev_idx,
                       const float* __restrict__ scores, const int32_t* __restrict__ experts,
                       const Logit* __restrict__ logits, int64_t num_tokens, int num_experts, int top_k,
                       int64_t num_rows, int mode, __nv_bfloat16* __restrict__ d_logits,
                       float* __restrict__ d_logit_rows) {
  using Key = TopkKey<Logit>;
  const int lane = threadIdx.x % 32;
  const int64_t t = int64_t(blockIdx.x) * kTopkWarpsPerBlock + threadIdx.x / 32;
  if (t >= num_tokens) return;
  float my_w = 0.f, my_s = 0.f;
  int my_expert = -1;
  if (lane < top_k) {
    const int32_t row = rev_idx[t * top_k + lane];
    my_expert = experts[t * top_k + lane];
    if (row < 0 || row >= num_rows || my_expert < 0 || my_expert >= num_experts) {
      printf("sonicmoe router_backward: (t, k) = (%lld, %d) has row %d (of %lld) and expert %d (of %d)\n",
             static_cast<long long>(t), lane, row, static_cast<long long>(num_rows), my_expert, num_experts);
      __trap();
    }
    float d_score = 0.f;
    for (int s = 0; s < slots; ++s) d_score += d_score_partial[int64_t(row) * slots + s];
    my_s = scores[t * top_k + lane];
    my_w = d_score * my_s;
  }
  float w_sum = my_w;
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) w_sum += __shfl_xor_sync(0xffffffffu, w_sum, offset);
  // The modes over the K chosen: expert e_k gets w_k - s_k W (the same expression at its sorted
  // row, where asked: the host refuses rows for softmax_topk).
  const auto over_chosen = [w_sum](float w, float s) { return w - s * w_sum; };
  if (d_logit_rows != nullptr && lane < top_k) d_logit_rows[rev_idx[t * top_k + lane]] = over_chosen(my_w, my_s);

  const bool over_all = mode == static_cast<int>(RouterMode::kSoftmaxTopk);
  const Logit* row = over_all ? logits + t * num_experts : nullptr;
  float top = -INFINITY, denominator = 1.f;  // softmax_topk's: the largest logit and the sum of exps
  if (over_all) {
    for (int e = lane; e < num_experts; e += 32) top = fmaxf(top, Key::load(row, e));
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, offset));
    float sum = 0.f;
    for (int e = lane; e < num_experts; e += 32) sum += expf(Key::load(row, e) - top);
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    denominator = sum;
  }
  __nv_bfloat16* out = d_logits + t * num_experts;
  for (int e0 = 0; e0 < num_experts; e0 += 32) {
    const int e = e0 + lane;
    float g = 0.f;
    if (over_all && e < num_experts) g = -(expf(Key::load(row, e) - top) / denominator) * w_sum;
    for (int k = 0; k < top_k; ++k) {
      const int expert = __shfl_sync(0xffffffffu, my_expert, k);
      const float w = __shfl_sync(0xffffffffu, my_w, k), s = __shfl_sync(0xffffffffu, my_s, k);
      if (e == expert) g = over_all ? w + g : over_chosen(w, s);
    }
    if (e < num_experts) out[e] = __float2bfloat16_rn(g);
  }
}

int chunk_pairs(int top_k) { return kRoutingChunkTokens * top_k; }

// router_topk_kernel with the fewest slots that hold E logits per lane.
template <class Logit>
Status launch_router_topk(const RouterTopkParams& p, const Logit* logits) {
  const int blocks = static_cast<int>((p.num_tokens + kTopkWarpsPerBlock - 1) / kTopkWarpsPerBlock);
  const int slots = (p.num_experts + 31) / 32;
  auto launch = [&](auto kernel) {
    kernel<<<blocks, kTopkWarpsPerBlock * 32, 0, p.stream>>>(logits, p.num_tokens, p.num_experts, p.top_k,
                                                           p.mode, p.scores, p.experts);
  };
  if (slots <= 1) launch(router_topk_kernel<Logit, 1>);
  else if (slots <= 2) launch(router_topk_kernel<Logit, 2>);
  else if (slots <= 4) launch(router_topk_kernel<Logit, 4>);
  else if (slots <= 8) launch(router_topk_kernel<Logit, 8>);
  else if (slots <= 16) launch(router_topk_kernel<Logit, 16>);
  else launch(router_topk_kernel<Logit, kMaxSlots>);
  SONICMOE_CUDA_TRY(cudaGetLastError());
  return Status::success();
}

// One rounding_probs_kernel. Its shared rows take up to 128 KiB (E 1024), past the 48 KiB
// default: a variant that can need more opts in once per device, to the most its E range needs
// (cudaFuncSetAttribute on every launch cost host time where E > 384).
template <class Logit, int kSlots, int kWarps>
Status launch_rounding_probs_variant(const RoundingProbsParams& p, const Logit* logits, int blocks, size_t smem) {
  constexpr auto kernel = &rounding_probs_kernel<Logit, kSlots, kWarps>;
  constexpr size_t kMostSmem = sizeof(float) * kRoundingTokensPerBlock * rounding_rows_pitch(32 * kSlots);
  if constexpr (kMostSmem > 48 * 1024) {
    int opted_in = 0;
    SONICMOE_TRY(once_per_device<kernel>(&opted_in, [&](int* done) -> Status {
      SONICMOE_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kMostSmem)));
      *done = 1;
      return Status::success();
    }));
  }
  kernel<<<blocks, kWarps * 32, smem, p.stream>>>(logits, p.num_tokens, p.num_experts, p.top_k, p.probs, p.probs_t,
                                                  p.chosen_t);
  SONICMOE_CUDA_TRY(cudaGetLastError());
  return Status::success();
}

// rounding_probs_kernel with the fewest slots that hold E logits per lane.
template <class Logit>
Status launch_rounding_probs(const RoundingProbsParams& p, const Logit* logits) {
  const int blocks = static_cast<int>((p.num_tokens + kRoundingTokensPerBlock - 1) / kRoundingTokensPerBlock);
  const size_t smem = sizeof(float) * kRoundingTokensPerBlock * rounding_rows_pitch(p.num_experts);
  // 16 warps where 32 keys (or 16 fp32 logits and their keys) spill at 64 registers.
  constexpr int kWideWarps = std::is_same_v<Logit, float> ? 16 : 32;
  const int slots = (p.num_experts + 31) / 32;
  if (slots <= 1) return launch_rounding_probs_variant<Logit, 1, 32>(p, logits, blocks, smem);
  if (slots <= 2) return launch_rounding_probs_variant<Logit, 2, 32>(p, logits, blocks, smem);
  if (slots <= 4) return launch_rounding_probs_variant<Logit, 4, 32>(p, logits, blocks, smem);
  if (slots <= 8) return launch_rounding_probs_variant<Logit, 8, 32>(p, logits, blocks, smem);
  if (slots <= 16) return launch_rounding_probs_variant<Logit, 16, kWideWarps>(p, logits, blocks, smem);
  return launch_rounding_probs_variant<Logit, kMaxSlots, 16>(p, logits, blocks, smem);
}

// R's limits, shared by router_topk and rounding_probs (op names the one in the message).
std::string check_router_shape(const char* op, int64_t num_tokens, int num_experts, int top_k) {
  if (num_tokens < 0 || num_tokens > INT32_MAX)
    return rule_message(op, "num_tokens", num_tokens, "must be in [0, 2^31 - 1]");
  if (num_experts < 1 || num_experts > kMaxRouterExperts)
    return rule_message(op, "num_experts", num_experts,
                        "must be in [1, " + std::to_string(kMaxRouterExperts) + "] (one warp holds a token's logits)");
  if (top_k < 1 || top_k > num_experts || top_k > kMaxRouterTopK)
    return rule_message(op, "top_k", top_k, "must be in [1, min(num_experts, " + std::to_string(kMaxRouterTopK) + ")]");
  return {};
}

// The top-K modes' rule, shared by router_topk and router_backward.
std::string check_router_mode(const char* op, int mode) {
  if (mode < 0 || mode > 2) return rule_message(op, "mode", mode, "must name a RouterMode (0, 1 or 2)");
  return {};
}

}  // namespace

std::string check_router_topk(const RouterTopkParams& p) {
  std::string problem = check_router_shape("router_topk", p.num_tokens, p.num_experts, p.top_k);
  return problem.empty() ? check_router_mode("router_topk", p.mode) : problem;
}

Status run_router_topk(const RouterTopkParams& p) {
  const std::string problem = check_router_topk(p);
  if (!problem.empty()) return Status::error(problem);
  if (p.num_tokens == 0) return Status::success();
  if (p.logits == nullptr || p.scores == nullptr || p.experts == nullptr)
    return Status::error("router_topk: logits, scores and experts must be non-null");
  if (p.logits_bf16) return launch_router_topk(p, static_cast<const __nv_bfloat16*>(p.logits));
  return launch_router_topk(p, static_cast<const float*>(p.logits));
}

std::string check_router_backward(const RouterBackwardParams& p) {
  std::string problem = check_router_shape("router_backward", p.num_tokens, p.num_experts, p.top_k);
  if (problem.empty()) problem = check_router_mode("router_backward", p.mode);
  if (!problem.empty()) return problem;
  if (p.slots < 1) return rule_message("router_backward", "slots", p.slots, "must be >= 1 (K4's score slots)");
  if (p.num_rows < 0 || p.num_rows > INT32_MAX)
    return rule_message("router_backward", "num_rows", p.num_rows, "must be in [0, 2^31 - 1] (int32 rev_idx)");
  if (p.d_logit_rows != nullptr && p.mode == static_cast<int>(RouterMode::kSoftmaxTopk))
    return rule_message("router_backward", "mode", p.mode,
                        "has d_logits at every expert (softmax_topk): no per-row d_logit_rows, use modes 0 or 2");
  return {};
}

Status run_router_backward(const RouterBackwardParams& p) {
  const std::string problem = check_router_backward(p);
  if (!problem.empty()) return Status::error(problem);
  if (p.num_tokens == 0) return Status::success();
  const bool over_all = p.mode == static_cast<int>(RouterMode::kSoftmaxTopk);
  if (p.d_score_partial == nullptr || p.rev_idx == nullptr || p.scores == nullptr || p.experts == nullptr ||
      p.d_logits == nullptr || (over_all && p.logits == nullptr))
    return Status::error("router_backward: d_score_partial, rev_idx, scores, experts, d_logits (and softmax_topk's "
                         "logits) must be non-null");
  const int blocks = static_cast<int>((p.num_tokens + kTopkWarpsPerBlock - 1) / kTopkWarpsPerBlock);
  auto launch = [&](const auto* logits) {
    using Logit = std::remove_cv_t<std::remove_pointer_t<decltype(logits)>>;
    router_backward_kernel<Logit><<<blocks, kTopkWarpsPerBlock * 32, 0, p.stream>>>(
        p.d_score_partial, p.slots, p.rev_idx, p.scores, p.experts, logits, p.num_tokens, p.num_experts, p.top_k,
        p.num_rows, p.mode, static_cast<__nv_bfloat16*>(p.d_logits), p.d_logit_rows);
  };
  if (p.logits_bf16) launch(static_cast<const __nv_bfloat16*>(p.logits));
  else launch(static_cast<const float*>(p.logits));
  SONICMOE_CUDA_TRY(cudaGetLastError());
  return Status::success();
}

std::string check_rounding_probs(const RoundingProbsParams& p) {
  return check_router_shape("rounding_probs", p.num_tokens, p.num_experts, p.top_k);
}

Status run_rounding_probs(const RoundingProbsParams& p) {
  const std::string problem = check_rounding_probs(p);
  if (!problem.empty()) return Status::error(problem);
  if (p.num_tokens == 0) return Status::success();
  if (p.logits == nullptr || p.probs_t == nullptr || p.chosen_t == nullptr)
    return Status::error("rounding_probs: logits, probs_t and chosen_t must be non-null");
  if (p.logits_bf16) return launch_rounding_probs(p, static_cast<const __nv_bfloat16*>(p.logits));
  return launch_rounding_probs(p, static_cast<const float*>(p.logits));
}

std::string check_sorted_layout(const SortedLayoutParams& p) {
  auto rule = [](const char* name, int64_t v, const std::string& r) {
    return rule_message("routing_metadata", name, v, r);
  };
  if (p.num_experts < 1 || p.num_experts > kMaxRouterExperts)
    return rule("num_experts", p.num_experts, "must be in [1, " + std::to_string(kMaxRouterExperts) + "]");
  if (p.top_k < 1 || p.top_k > kMaxRouterTopK)
    return rule("top_k", p.top_k, "must be in [1, " + std::to_string(kMaxRouterTopK) + "]");
  if (p.num_tokens < 0 || p.num_tokens * p.top_k > INT32_MAX)
    return rule("num_tokens", p.num_tokens, "num_tokens * top_k rows must fit in int32");
  return {};
}

size_t sorted_layout_workspace_size(int64_t num_tokens, int num_experts) {
  const int64_t chunks = (num_tokens + kRoutingChunkTokens - 1) / kRoutingChunkTokens;
  if (chunks == 0) return 0;
  return static_cast<size_t>(chunks + 1) * num_experts * sizeof(int32_t);  // chunk counts, expert totals
}

Status run_sorted_layout(const SortedLayoutParams& p) {
  const std::string problem = check_sorted_layout(p);
  if (!problem.empty()) return Status::error(problem);
  // With no tokens only expert_offsets (all zero) is written: the other buffers may be empty.
  if (p.expert_offsets == nullptr ||
      (p.num_tokens > 0 && (p.experts == nullptr || p.workspace == nullptr || p.gather_idx == nullptr ||
                            p.rev_idx == nullptr)))
    return Status::error("routing_metadata: experts, expert_offsets, gather_idx, rev_idx and workspace must be non-null");
  if (p.workspace_bytes < sorted_layout_workspace_size(p.num_tokens, p.num_experts))
    return Status::error("routing_metadata: workspace of " + std::to_string(p.workspace_bytes) +
                         " bytes is smaller than the " +
                         std::to_string(sorted_layout_workspace_size(p.num_tokens, p.num_experts)) + " needed");
  const int64_t pairs = p.num_tokens * p.top_k;
  const int chunks = static_cast<int>((p.num_tokens + kRoutingChunkTokens - 1) / kRoutingChunkTokens);
  const int per_chunk = chunk_pairs(p.top_k);
  const size_t smem = size_t(p.num_experts) * sizeof(int32_t);
  if (chunks == 0) {
    SONICMOE_CUDA_TRY(cudaMemsetAsync(p.expert_offsets, 0, sizeof(int32_t) * (p.num_experts + 1), p.stream));
    return Status::success();
  }
  auto* counts = static_cast<int32_t*>(p.workspace);
  int32_t* expert_totals = counts + int64_t(chunks) * p.num_experts;
  if (p.experts_int64) {
    expert_histogram_kernel<<<chunks, per_chunk, smem, p.stream>>>(
        static_cast<const int64_t*>(p.experts), pairs, per_chunk, p.num_experts, counts);
  } else {
    expert_histogram_kernel<<<chunks, per_chunk, smem, p.stream>>>(
        static_cast<const int32_t*>(p.experts), pairs, per_chunk, p.num_experts, counts);
  }
  SONICMOE_CUDA_TRY(cudaGetLastError());
  expert_chunk_scan_kernel<<<p.num_experts, kChunkScanThreads, 0, p.stream>>>(counts, chunks, p.num_experts,
                                                                             expert_totals);
  SONICMOE_CUDA_TRY(cudaGetLastError());
  expert_offsets_kernel<<<1, kScanThreads, 0, p.stream>>>(expert_totals, p.num_experts, p.expert_offsets);
  SONICMOE_CUDA_TRY(cudaGetLastError());
  if (p.experts_int64) {
    sorted_layout_kernel<<<chunks, per_chunk, smem, p.stream>>>(
        static_cast<const int64_t*>(p.experts), pairs, per_chunk, p.top_k, p.num_experts, counts,
        p.expert_offsets, p.gather_idx, p.rev_idx);
  } else {
    sorted_layout_kernel<<<chunks, per_chunk, smem, p.stream>>>(
        static_cast<const int32_t*>(p.experts), pairs, per_chunk, p.top_k, p.num_experts, counts,
        p.expert_offsets, p.gather_idx, p.rev_idx);
  }
  SONICMOE_CUDA_TRY(cudaGetLastError());
  return Status::success();
}

}  // namespace sonicmoe
