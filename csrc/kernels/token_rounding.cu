// Token rounding (DESIGN §6) on the device: the rounded assignment and its sorted layout, in
// expert-major (E, T) buffers, with no host sync. Plain CUDA, arch-generic.
//
// Assignment, one block per expert: count the expert's top-K tokens, round the count by the
// rule, and flip the |target - count| (< tile) tokens that rounding changes: the best-scoring
// unchosen ones when rounding up, the worst-scoring chosen ones when rounding down. They are
// found by a radix select on the probability bits (3 passes of 12, 11 and 8 bits over the
// expert's row), then an ordered pass that takes the tied tokens at the threshold by token index
// (lower first when adding, higher first when dropping), exactly the order of
// sonicmoe.routing's sort.
//
// Layout: (1) per-expert and per-token counts, (2) one-block scans into expert_offsets and
// token_offsets, (3) per expert, its tokens in order give its sorted rows (gather_idx,
// sorted_scores, and each pair's row in an (E, T) scratch), (4) per block of 32 tokens, each
// token's experts in order give its entries (rows, row_scores).
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cuda_runtime_api.h>

#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>

#include "common/cuda_check.h"
#include "common/host_rules.h"
#include "sonicmoe.h"

namespace sonicmoe {
namespace {

constexpr int kThreads = 512;       // per expert block
constexpr int kScanThreads = 1024;  // the one-block scans
constexpr int kTokensPerBlock = 32; // entry placement

// The assignment's radix select over key bits 30..0 (bit 31, the sign, is the same for every
// candidate: probabilities are >= 0): digits of 12, 11 and 8 bits (the later passes use part
// of the histogram), each thread of the digit search summing 8 adjacent bins.
constexpr int kRadixPasses = 3;
constexpr int kRadixBins = 4096;
__device__ __forceinline__ int radix_shift(int pass) { return pass == 0 ? 19 : pass == 1 ? 8 : 0; }
__device__ __forceinline__ uint32_t radix_mask(int pass) { return pass == 0 ? 0xfffu : pass == 1 ? 0x7ffu : 0xffu; }
constexpr int kBinsPerThread = kRadixBins / kThreads;
static_assert(kBinsPerThread * kThreads == kRadixBins, "whole bins per thread");

using BlockScan = cub::BlockScan<int, kThreads>;
using BlockReduce = cub::BlockReduce<int, kThreads>;

// Rank key of token t for expert e: larger = taken first. Adding ranks unchosen tokens by
// probability; dropping ranks chosen tokens by reversed probability (the worst first).
// Non-negative floats order as their bits.
__device__ __forceinline__ uint32_t rank_key(float prob, bool adding) {
  const uint32_t bits = __float_as_uint(prob);
  return adding ? bits : ~bits;
}

// kVec consecutive tokens of an expert's row (a chunk): their probabilities and choices, one
// byte per token in `flags` (16-byte and 4-byte loads when kVec is 4: v1 loaded a token at a
// time and, one load in flight per thread, took 109 us at T 16384, E 512).
template <int kVec>
__device__ __forceinline__ void load_chunk(const float* probs, const uint8_t* chosen, int64_t c, float (&p)[kVec],
                                           uint32_t& flags) {
  if constexpr (kVec == 4) {
    const float4 v = reinterpret_cast<const float4*>(probs)[c];
    p[0] = v.x, p[1] = v.y, p[2] = v.z, p[3] = v.w;
    flags = reinterpret_cast<const uint32_t*>(chosen)[c];
  } else {
    static_assert(kVec == 1, "chunks of 1 or 4 tokens");
    p[0] = probs[c];
    flags = chosen[c];
  }
}
__device__ __forceinline__ bool chunk_flag(uint32_t flags, int j) { return (flags >> (8 * j)) & 1u; }

// One block per expert. kVec 4 where T % 4 == 0 (every row 16-byte aligned), else 1.
template <int kVec>
__global__ void __launch_bounds__(kThreads)
token_rounding_assign_kernel(const float* __restrict__ probs_t, const uint8_t* __restrict__ chosen_t,
                             int64_t num_tokens, int tile, int rule, uint8_t* __restrict__ assigned_t,
                             int32_t* __restrict__ counts) {
  using Word = std::conditional_t<kVec == 4, uint32_t, uint8_t>;  // a chunk's flags
  __shared__ union {
    typename BlockReduce::TempStorage reduce;
    typename BlockScan::TempStorage scan;
  } temp;
  __shared__ int histogram[kRadixBins];
  __shared__ int shared_int[2];
  const int e = blockIdx.x;
  const int64_t T = num_tokens;
  const int64_t chunks = T / kVec;
  const float* probs = probs_t + e * T;  // one expert's row: coalesced along tokens
  const uint8_t* chosen = chosen_t + e * T;
  Word* out = reinterpret_cast<Word*>(assigned_t + e * T);

  int mine = 0;
  for (int64_t c = threadIdx.x; c < chunks; c += kThreads) {
    const Word w = reinterpret_cast<const Word*>(chosen)[c];
    out[c] = w;
    mine += __popc(uint32_t(w));  // bool bytes are 0 or 1
  }
  const int count = BlockReduce(temp.reduce).Sum(mine);  // valid in thread 0
  if (threadIdx.x == 0) {
    int target = rule == 0 ? (count + tile / 2) / tile * tile
               : rule == 1 ? (count + tile - 1) / tile * tile
                           : count / tile * tile;
    target = static_cast<int>(min(int64_t(target), T));
    shared_int[0] = target - count;
    counts[e] = target;
  }
  __syncthreads();
  const int need = shared_int[0];
  __syncthreads();  // shared_int is reused below
  if (need == 0) return;
  const bool adding = need > 0;
  int remaining = adding ? need : -need;  // candidates still to take, < tile

  // Radix select: the key of the remaining-th largest candidate, 12 bits first. With 8-bit
  // digits the first pass saw only the sign and 7 exponent bits, which softmax probabilities
  // share: nearly every token's atomic hit one or two bins (122 us at T 16384, E 512). 12 bits
  // below the sign reach 4 mantissa bits, spreading the tokens over ~100 bins, and 3 passes
  // read the row where 4 did.
  uint32_t prefix = rank_key(0.f, adding) & 0x80000000u, prefix_mask = 0x80000000u;
  for (int pass = 0; pass < kRadixPasses; ++pass) {
    const int shift = radix_shift(pass);
    const uint32_t mask = radix_mask(pass);
    for (int i = threadIdx.x; i < kRadixBins; i += kThreads) histogram[i] = 0;
    __syncthreads();
#pragma unroll 2
    for (int64_t c = threadIdx.x; c < chunks; c += kThreads) {
      float p[kVec];
      uint32_t flags;
      load_chunk<kVec>(probs, chosen, c, p, flags);
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        if (chunk_flag(flags, j) == adding) continue;  // not a candidate
        const uint32_t key = rank_key(p[j], adding);
        if ((key & prefix_mask) == prefix) atomicAdd(&histogram[(key >> shift) & mask], 1);
      }
    }
    __syncthreads();
    // The digit where the count from the top reaches `remaining`: thread i sums bins
    // [kRadixBins - kBinsPerThread (i + 1), kRadixBins - kBinsPerThread i), a block scan gives
    // the count above them, and the one thread whose bins cross `remaining` walks them.
    const int top_bin = kRadixBins - 1 - kBinsPerThread * threadIdx.x;
    int mine_sum = 0;
    for (int b = 0; b < kBinsPerThread; ++b) mine_sum += histogram[top_bin - b];
    int above, total;
    BlockScan(temp.scan).ExclusiveSum(mine_sum, above, total);
    if (above < remaining && remaining <= above + mine_sum) {
      int digit = top_bin;
      while (above + histogram[digit] < remaining) above += histogram[digit--];
      shared_int[0] = digit;
      shared_int[1] = above;
    }
    __syncthreads();
    prefix |= uint32_t(shared_int[0]) << shift;
    prefix_mask |= mask << shift;
    remaining -= shared_int[1];
    __syncthreads();
  }
  const uint32_t threshold = prefix;  // `remaining` candidates with exactly this key are taken

  // Every candidate above the threshold flips; of those at it, the first `remaining` in tie
  // order: token order when adding, reversed when dropping (chunks from the last, each one's
  // tokens from its last).
  int taken_ties = 0;
  for (int64_t base = 0; base < chunks; base += kThreads) {
    const int64_t i = base + threadIdx.x;
    const int64_t c = adding ? i : chunks - 1 - i;
    float p[kVec] = {};
    uint32_t flags = 0;
    if (i < chunks) load_chunk<kVec>(probs, chosen, c, p, flags);
    uint32_t above = 0, tie = 0;  // bit j: token j of the chunk
    int my_ties = 0;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const bool candidate = i < chunks && chunk_flag(flags, j) != adding;
      const uint32_t key = rank_key(p[j], adding);
      above |= uint32_t(candidate && key > threshold) << j;
      tie |= uint32_t(candidate && key == threshold) << j;
      my_ties += candidate && key == threshold;
    }
    int rank, ties;
    BlockScan(temp.scan).ExclusiveSum(my_ties, rank, ties);
    uint32_t flip = 0;  // one bit per token byte
#pragma unroll
    for (int step = 0; step < kVec; ++step) {
      const int j = adding ? step : kVec - 1 - step;
      if ((tie >> j) & 1u) flip |= uint32_t(taken_ties + rank++ < remaining) << (8 * j);
      flip |= ((above >> j) & 1u) << (8 * j);
    }
    if (flip != 0) out[c] ^= Word(flip);
    taken_ties += ties;
    __syncthreads();  // temp.scan is reused
    if (taken_ties >= remaining && base + kThreads < chunks) {
      // Only keys above the threshold remain to flip: finish without the scan.
      for (int64_t k = base + kThreads + threadIdx.x; k < chunks; k += kThreads) {
        const int64_t u = adding ? k : chunks - 1 - k;
        load_chunk<kVec>(probs, chosen, u, p, flags);
        uint32_t rest = 0;
#pragma unroll
        for (int j = 0; j < kVec; ++j)
          rest |= uint32_t(chunk_flag(flags, j) != adding && rank_key(p[j], adding) > threshold) << (8 * j);
        if (rest != 0) out[u] ^= Word(rest);
      }
      break;
    }
  }
}

// Per-expert counts of an (E, T) assignment: its row sums.
__global__ void __launch_bounds__(kThreads)
expert_count_kernel(const uint8_t* __restrict__ assigned_t, int64_t num_tokens, int32_t* __restrict__ counts) {
  __shared__ typename BlockReduce::TempStorage temp;
  int mine = 0;
  for (int64_t t = threadIdx.x; t < num_tokens; t += kThreads) mine += assigned_t[blockIdx.x * num_tokens + t];
  const int total = BlockReduce(temp).Sum(mine);
  if (threadIdx.x == 0) counts[blockIdx.x] = total;
}

// Per-token counts of an (E, T) assignment, 32 tokens per block through a shared tile.
__global__ void __launch_bounds__(kThreads)
token_counts_kernel(const uint8_t* __restrict__ assigned_t, int64_t num_tokens, int num_experts,
                    int32_t* __restrict__ token_counts) {
  const int64_t t0 = int64_t(blockIdx.x) * kTokensPerBlock;
  const int lane = threadIdx.x % kTokensPerBlock;
  int mine = 0;
  for (int e = threadIdx.x / kTokensPerBlock; e < num_experts; e += kThreads / kTokensPerBlock)
    if (t0 + lane < num_tokens) mine += assigned_t[e * num_tokens + t0 + lane];
  __shared__ int partial[kThreads];
  partial[threadIdx.x] = mine;
  __syncthreads();
  if (threadIdx.x < kTokensPerBlock && t0 + threadIdx.x < num_tokens) {
    int sum = 0;
    for (int j = threadIdx.x; j < kThreads; j += kTokensPerBlock) sum += partial[j];
    token_counts[t0 + threadIdx.x] = sum;
  }
}

// out[0] = 0, out[i + 1] = in[0] + ... + in[i], for any n, in one block (a carried loop).
__global__ void __launch_bounds__(kScanThreads)
exclusive_scan_kernel(const int32_t* __restrict__ in, int64_t n, int32_t* __restrict__ out) {
  using Scan = cub::BlockScan<int, kScanThreads>;
  __shared__ typename Scan::TempStorage temp;
  int carry = 0;
  if (threadIdx.x == 0) out[0] = 0;
  for (int64_t base = 0; base < n; base += kScanThreads) {
    const int64_t i = base + threadIdx.x;
    int inclusive, total;
    Scan(temp).InclusiveSum(i < n ? in[i] : 0, inclusive, total);
    if (i < n) out[i + 1] = carry + inclusive;
    carry += total;
    __syncthreads();
  }
}

// Per expert: its assigned tokens in order are its sorted rows. A thread takes kRowItems
// consecutive tokens per pass (one 8-byte load where rows are 8-byte aligned): v1 took one token
// per thread, 32 block scans per expert at T 16384 (57 µs for E 512 on the H200).
constexpr int kRowItems = 8;
__global__ void __launch_bounds__(kThreads)
expert_rows_kernel(const uint8_t* __restrict__ assigned_t, const float* __restrict__ scores_t,
                   int64_t num_tokens, const int32_t* __restrict__ expert_offsets,
                   int32_t* __restrict__ gather_idx, float* __restrict__ sorted_scores,
                   int32_t* __restrict__ row_of) {
  __shared__ typename BlockScan::TempStorage temp;
  const int e = blockIdx.x;
  const int64_t T = num_tokens;
  const uint8_t* flags = assigned_t + e * T;
  const bool aligned = T % kRowItems == 0;
  int row = expert_offsets[e];
  for (int64_t base = 0; base < T; base += int64_t(kThreads) * kRowItems) {
    const int64_t t0 = base + int64_t(threadIdx.x) * kRowItems;
    int mine[kRowItems];
    if (aligned && t0 < T) {
      const uint2 packed = *reinterpret_cast<const uint2*>(flags + t0);
      #pragma unroll
      for (int i = 0; i < kRowItems; ++i) mine[i] = ((i < 4 ? packed.x : packed.y) >> (8 * (i % 4))) & 0xff;
    } else {
      #pragma unroll
      for (int i = 0; i < kRowItems; ++i) mine[i] = t0 + i < T ? flags[t0 + i] : 0;
    }
    int rank[kRowItems], total;
    BlockScan(temp).ExclusiveSum(mine, rank, total);
    #pragma unroll
    for (int i = 0; i < kRowItems; ++i) {
      if (mine[i]) {
        const int64_t t = t0 + i;
        gather_idx[row + rank[i]] = static_cast<int32_t>(t);
        sorted_scores[row + rank[i]] = scores_t[e * T + t];
        row_of[e * T + t] = row + rank[i];
      }
    }
    row += total;
    __syncthreads();  // temp is reused
  }
}

// Per token: its assigned experts in order are its entries. A block stages 32 tokens' column of
// the assignment (coalesced along tokens), then warp w walks tokens w, w + 16, ...
__global__ void __launch_bounds__(kThreads)
token_entries_kernel(const uint8_t* __restrict__ assigned_t, const float* __restrict__ scores_t,
                     const int32_t* __restrict__ row_of, int64_t num_tokens, int num_experts,
                     const int32_t* __restrict__ token_offsets, int32_t* __restrict__ rows,
                     float* __restrict__ row_scores) {
  extern __shared__ uint8_t tile[];  // [num_experts][kTokensPerBlock]
  const int64_t T = num_tokens;
  const int64_t t0 = int64_t(blockIdx.x) * kTokensPerBlock;
  for (int i = threadIdx.x; i < num_experts * kTokensPerBlock; i += kThreads) {
    const int e = i / kTokensPerBlock, j = i % kTokensPerBlock;
    tile[i] = t0 + j < T ? assigned_t[e * T + t0 + j] : 0;
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int j = warp; j < kTokensPerBlock; j += kThreads / 32) {
    const int64_t t = t0 + j;
    if (t >= T) break;
    int entry = token_offsets[t];
    for (int e0 = 0; e0 < num_experts; e0 += 32) {
      const int e = e0 + lane;
      const bool mine = e < num_experts && tile[e * kTokensPerBlock + j];
      const unsigned ballot = __ballot_sync(0xffffffffu, mine);
      if (mine) {
        const int at = entry + __popc(ballot & ((1u << lane) - 1));
        rows[at] = row_of[e * T + t];
        row_scores[at] = scores_t[e * T + t];
      }
      entry += __popc(ballot);
    }
  }
}

}  // namespace

std::string check_token_rounding(const TokenRoundingParams& p) {
  auto rule = [](const char* name, int64_t v, const char* r) { return rule_message("token_rounding_assign", name, v, r); };
  if (p.num_experts < 1) return rule("num_experts", p.num_experts, "must be >= 1");
  if (p.num_tokens < 0 || p.num_tokens * p.num_experts > INT32_MAX)
    return rule("num_tokens", p.num_tokens, "num_tokens * num_experts must fit in int32");
  if (p.tile < 1) return rule("tile", p.tile, "must be >= 1");
  if (p.rule < 0 || p.rule > 2) return rule("rule", p.rule, "must be 0 (nearest), 1 (up) or 2 (down)");
  return {};
}

Status run_token_rounding_assign(const TokenRoundingParams& p) {
  const std::string problem = check_token_rounding(p);
  if (!problem.empty()) return Status::error(problem);
  if (p.counts == nullptr) return Status::error("token_rounding_assign: counts must be non-null");
  if (p.num_tokens == 0) {  // every expert keeps its 0 tokens
    SONICMOE_CUDA_TRY(cudaMemsetAsync(p.counts, 0, sizeof(int32_t) * p.num_experts, p.stream));
    return Status::success();
  }
  if (p.probs_t == nullptr || p.chosen_t == nullptr || p.assigned_t == nullptr)
    return Status::error("token_rounding_assign: probs_t, chosen_t and assigned_t must be non-null");
  // 4-token chunks where every row starts 16-byte aligned (probs_t) and 4-byte aligned (chosen_t,
  // assigned_t): T % 4 == 0 and aligned bases (a view into a larger tensor may not be).
  const bool vec4 = p.num_tokens % 4 == 0 && reinterpret_cast<uintptr_t>(p.probs_t) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(p.chosen_t) % 4 == 0 && reinterpret_cast<uintptr_t>(p.assigned_t) % 4 == 0;
  if (vec4)
    token_rounding_assign_kernel<4><<<p.num_experts, kThreads, 0, p.stream>>>(
        p.probs_t, p.chosen_t, p.num_tokens, p.tile, p.rule, p.assigned_t, p.counts);
  else
    token_rounding_assign_kernel<1><<<p.num_experts, kThreads, 0, p.stream>>>(
        p.probs_t, p.chosen_t, p.num_tokens, p.tile, p.rule, p.assigned_t, p.counts);
  SONICMOE_CUDA_TRY(cudaGetLastError());
  return Status::success();
}

std::string check_dense_layout(const DenseLayoutParams& p) {
  auto rule = [](const char* name, int64_t v, const char* r) { return rule_message("dense_layout", name, v, r); };
  if (p.num_experts < 1 || p.num_experts > kMaxRouterExperts)
    return rule("num_experts", p.num_experts, "must be in [1, 1024]");
  if (p.num_tokens < 0 || p.num_tokens * p.num_experts > INT32_MAX)
    return rule("num_tokens", p.num_tokens, "num_tokens * num_experts must fit in int32");
  return {};
}

size_t dense_layout_workspace_size(int64_t num_tokens, int num_experts) {
  // counts (E), token counts (T), row_of (E x T)
  return sizeof(int32_t) * (size_t(num_experts) + size_t(num_tokens) + size_t(num_experts) * num_tokens);
}

Status run_dense_layout(const DenseLayoutParams& p) {
  const std::string problem = check_dense_layout(p);
  if (!problem.empty()) return Status::error(problem);
  if (p.expert_offsets == nullptr || p.token_offsets == nullptr ||
      (p.num_tokens > 0 && (p.assigned_t == nullptr || p.scores_t == nullptr || p.workspace == nullptr)))
    return Status::error("dense_layout: assigned_t, scores_t, the outputs and workspace must be non-null");
  if (p.workspace_bytes < dense_layout_workspace_size(p.num_tokens, p.num_experts))
    return Status::error("dense_layout: workspace smaller than dense_layout_workspace_size()");
  auto* expert_counts = static_cast<int32_t*>(p.workspace);
  int32_t* token_counts = expert_counts + p.num_experts;
  int32_t* row_of = token_counts + p.num_tokens;
  const int64_t T = p.num_tokens;
  const int token_blocks = static_cast<int>((T + kTokensPerBlock - 1) / kTokensPerBlock);

  if (T == 0) {
    SONICMOE_CUDA_TRY(cudaMemsetAsync(p.expert_offsets, 0, sizeof(int32_t) * (p.num_experts + 1), p.stream));
    SONICMOE_CUDA_TRY(cudaMemsetAsync(p.token_offsets, 0, sizeof(int32_t), p.stream));
    return Status::success();
  }
  expert_count_kernel<<<p.num_experts, kThreads, 0, p.stream>>>(p.assigned_t, T, expert_counts);
  SONICMOE_CUDA_TRY(cudaGetLastError());
  token_counts_kernel<<<token_blocks, kThreads, 0, p.stream>>>(p.assigned_t, T, p.num_experts, token_counts);
  SONICMOE_CUDA_TRY(cudaGetLastError());
  exclusive_scan_kernel<<<1, kScanThreads, 0, p.stream>>>(expert_counts, p.num_experts, p.expert_offsets);
  SONICMOE_CUDA_TRY(cudaGetLastError());
  exclusive_scan_kernel<<<1, kScanThreads, 0, p.stream>>>(token_counts, T, p.token_offsets);
  SONICMOE_CUDA_TRY(cudaGetLastError());
  expert_rows_kernel<<<p.num_experts, kThreads, 0, p.stream>>>(p.assigned_t, p.scores_t, T, p.expert_offsets,
                                                               p.gather_idx, p.sorted_scores, row_of);
  SONICMOE_CUDA_TRY(cudaGetLastError());
  const size_t smem = size_t(p.num_experts) * kTokensPerBlock;
  token_entries_kernel<<<token_blocks, kThreads, smem, p.stream>>>(p.assigned_t, p.scores_t, row_of, T,
                                                                  p.num_experts, p.token_offsets, p.rows,
                                                                  p.row_scores);
  SONICMOE_CUDA_TRY(cudaGetLastError());
  return Status::success();
}

}  // namespace sonicmoe
