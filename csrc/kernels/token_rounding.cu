// Token rounding (docs/design.md §6) on the device: the rounded assignment and its sorted layout, in
// expert-major (E, T) buffers, with no host sync. Plain CUDA, arch-generic.
//
// Assignment, one block per expert: count the expert's top-K tokens, round the count by the
// rule, and flip the |target - count| (< tile) tokens that rounding changes: the best-scoring
// unchosen ones when rounding up, the worst-scoring chosen ones when rounding down. They are
// found by a radix select on the probability bits (digits of 12, 11 and 8 bits), with the
// tied tokens at the threshold taken by token index (lower first when adding, higher first when
// dropping), exactly the order of sonicmoe.routing's sort. Two passes over the expert's row: the
// one that copies the choice counts the first digit; the second flips every candidate above the
// threshold's first-digit bin and lists the bin's candidates in shared memory, where the later
// digits and the ties are taken. A bin too large for the list (a row of near-equal
// probabilities) takes them by passes over the row instead, then an ordered pass for the ties.
//
// Layout, on chunks of 32 tokens: (1) each expert's 32-bit mask of each chunk, (2) per expert,
// the prefix of its masks' counts over the chunks, and the chunks' prefix of pairs, (3) per
// chunk, each pair's sorted row (gather_idx, sorted_scores) and token entry (rows, row_scores)
// by popcounts, and the zeros past the M pairs.
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

constexpr int kThreads = 512;       // per block (the assignment takes 1024 where E <= 128)
constexpr int kScanThreads = 1024;  // the one-block scans

// The assignment's radix select over key bits 30..0 (bit 31, the sign, is the same for every
// candidate: probabilities are >= 0): digits of 12, 11 and 8 bits (the later passes use part
// of the histogram), each thread of the digit search summing 8 adjacent bins.
constexpr int kRadixPasses = 3;
constexpr int kRadixBins = 4096;
__device__ __forceinline__ int radix_shift(int pass) { return pass == 0 ? 19 : pass == 1 ? 8 : 0; }
__device__ __forceinline__ uint32_t radix_mask(int pass) { return pass == 0 ? 0xfffu : pass == 1 ? 0x7ffu : 0xffu; }

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

// One digit of the radix select, by the whole block: the digit of `pass` where the count of
// candidates from the top (bins: that digit's histogram) reaches `remaining`. Thread i sums bins
// [kRadixBins - kBinsPerThread (i + 1), kRadixBins - kBinsPerThread i), a block scan gives the
// count above them, and the one thread whose bins cross `remaining` walks them. Appends the
// digit to prefix / prefix_mask and takes the candidates above it from remaining.
template <int kBlockThreads>
__device__ __forceinline__ void take_digit(const int* bins, int pass,
                                           typename cub::BlockScan<int, kBlockThreads>::TempStorage& scan,
                                           int (&shared_int)[2], uint32_t& prefix, uint32_t& prefix_mask,
                                           int& remaining) {
  constexpr int kBinsPerThread = kRadixBins / kBlockThreads;
  static_assert(kBinsPerThread * kBlockThreads == kRadixBins, "whole bins per thread");
  const int top_bin = kRadixBins - 1 - kBinsPerThread * threadIdx.x;
  int mine_sum = 0;
  for (int b = 0; b < kBinsPerThread; ++b) mine_sum += bins[top_bin - b];
  int above, total;
  cub::BlockScan<int, kBlockThreads>(scan).ExclusiveSum(mine_sum, above, total);
  if (above < remaining && remaining <= above + mine_sum) {
    int digit = top_bin;
    while (above + bins[digit] < remaining) above += bins[digit--];
    shared_int[0] = digit;
    shared_int[1] = above;
  }
  __syncthreads();
  prefix |= uint32_t(shared_int[0]) << radix_shift(pass);
  prefix_mask |= radix_mask(pass) << radix_shift(pass);
  remaining -= shared_int[1];
  __syncthreads();  // shared_int is reused
}

// Flips token t's byte of an expert's row: by an atomic where the row is read as 4-token words
// (the list's flips may share a word), by a plain write where each token is its own byte.
__device__ __forceinline__ void flip_token(uint32_t* out, uint32_t t) { atomicXor(out + t / 4, 1u << (8 * (t % 4))); }
__device__ __forceinline__ void flip_token(uint8_t* out, uint32_t t) { out[t] ^= 1; }

// The later digits and the ties of the radix select from a list in shared memory of the
// candidates in the threshold's first-digit bin (`listed` entries of key << 32 | token, each
// matching prefix / prefix_mask): flips every listed token above the threshold and, of those at
// it, the first `remaining` in tie order (lower tokens first when adding, higher first when
// dropping). bins: kRadixBins ints of scratch.
template <int kBlockThreads, class Word>
__device__ __forceinline__ void take_from_list(const uint64_t* list, int listed, bool adding,
                                               typename cub::BlockScan<int, kBlockThreads>::TempStorage& scan,
                                               int* bins, int (&shared_int)[2], uint32_t prefix, uint32_t prefix_mask,
                                               int remaining, Word* out) {
  for (int pass = 1; pass < kRadixPasses; ++pass) {
    for (int i = threadIdx.x; i < kRadixBins; i += kBlockThreads) bins[i] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < listed; i += kBlockThreads) {
      const uint32_t key = uint32_t(list[i] >> 32);
      if ((key & prefix_mask) == prefix) atomicAdd(&bins[(key >> radix_shift(pass)) & radix_mask(pass)], 1);
    }
    __syncthreads();
    take_digit<kBlockThreads>(bins, pass, scan, shared_int, prefix, prefix_mask, remaining);
  }
  const uint32_t threshold = prefix;  // `remaining` of the listed tokens with exactly this key are taken
  int* ties = bins;                    // the tokens at the threshold, in no order
  if (threadIdx.x == 0) shared_int[0] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < listed; i += kBlockThreads) {
    const uint32_t key = uint32_t(list[i] >> 32), token = uint32_t(list[i]);
    if (key > threshold) flip_token(out, token);
    else if (key == threshold) ties[atomicAdd(&shared_int[0], 1)] = static_cast<int>(token);
  }
  __syncthreads();
  const int tied = shared_int[0];  // >= remaining
  for (int i = threadIdx.x; i < tied; i += kBlockThreads) {
    const int token = ties[i];
    int ahead = 0;  // ties before this one in tie order; counted only where not every tie is taken
    if (tied > remaining)
      for (int k = 0; k < tied; ++k) ahead += adding ? ties[k] < token : ties[k] > token;
    if (ahead < remaining) flip_token(out, static_cast<uint32_t>(token));
  }
}

// One block per expert. kVec 4 where T % 4 == 0 (every row 16-byte aligned), else 1.
template <int kVec, int kBlockThreads>
__global__ void __launch_bounds__(kBlockThreads)
token_rounding_assign_kernel(const float* __restrict__ probs_t, const uint8_t* __restrict__ chosen_t,
                             int64_t num_tokens, int tile, int rule, uint8_t* __restrict__ assigned_t,
                             int32_t* __restrict__ counts) {
  using Word = std::conditional_t<kVec == 4, uint32_t, uint8_t>;  // a chunk's flags
  using Scan = cub::BlockScan<int, kBlockThreads>;
  using Reduce = cub::BlockReduce<int, kBlockThreads>;
  __shared__ union {
    typename Reduce::TempStorage reduce;
    typename Scan::TempStorage scan;
  } temp;
  // The first digit's counts, in the pass that copies the choice (the direction is known only
  // after the count): [0] of the unchosen tokens (candidates when adding), [1] of the chosen
  // ones (when dropping). The later passes use [0].
  __shared__ alignas(16) int histogram[2][kRadixBins];
  __shared__ int shared_int[2];
  __shared__ int list_size;
  const int e = blockIdx.x;
  const int64_t T = num_tokens;
  const int64_t chunks = T / kVec;
  const float* probs = probs_t + e * T;  // one expert's row: coalesced along tokens
  const uint8_t* chosen = chosen_t + e * T;
  Word* out = reinterpret_cast<Word*>(assigned_t + e * T);

  for (int i = threadIdx.x; i < 2 * kRadixBins; i += kBlockThreads) histogram[i / kRadixBins][i % kRadixBins] = 0;
  __syncthreads();
  int mine = 0;
  for (int64_t c = threadIdx.x; c < chunks; c += kBlockThreads) {
    float p[kVec];
    uint32_t flags;
    load_chunk<kVec>(probs, chosen, c, p, flags);
    out[c] = Word(flags);
    mine += __popc(flags);  // bool bytes are 0 or 1
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const bool was_chosen = chunk_flag(flags, j);
      const uint32_t key = rank_key(p[j], !was_chosen);
      atomicAdd(&histogram[was_chosen][(key >> radix_shift(0)) & radix_mask(0)], 1);
    }
  }
  const int count = Reduce(temp.reduce).Sum(mine);  // valid in thread 0
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
  // below the sign reach 4 mantissa bits, spreading the tokens over ~100 bins.
  uint32_t prefix = rank_key(0.f, adding) & 0x80000000u, prefix_mask = 0x80000000u;
  take_digit<kBlockThreads>(histogram[adding ? 0 : 1], 0, temp.scan, shared_int, prefix, prefix_mask, remaining);
  const uint32_t bin_prefix = prefix, bin_mask = prefix_mask;  // the threshold's first-digit bin

  // The second pass over the row flips every candidate above that bin (taken whatever its later
  // digits) and lists the bin's candidates, (key, token), in shared memory (the dropping
  // histogram's space, free once its digit is taken). Where they fit, the later digits and the
  // ties are taken from the list: two passes over the row where four ran.
  uint64_t* list = reinterpret_cast<uint64_t*>(histogram[1]);
  constexpr int kListCapacity = sizeof(histogram[1]) / sizeof(uint64_t);
  if (threadIdx.x == 0) list_size = 0;
  __syncthreads();
  for (int64_t c = threadIdx.x; c < chunks; c += kBlockThreads) {
    float p[kVec];
    uint32_t flags;
    load_chunk<kVec>(probs, chosen, c, p, flags);
    uint32_t flip = 0;  // one bit per token byte
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      if (chunk_flag(flags, j) == adding) continue;  // not a candidate
      const uint32_t key = rank_key(p[j], adding);
      const uint32_t bin = key & bin_mask;
      if (bin > bin_prefix) {
        flip |= 1u << (8 * j);
      } else if (bin == bin_prefix) {
        const int slot = atomicAdd(&list_size, 1);
        if (slot < kListCapacity) list[slot] = uint64_t(key) << 32 | uint32_t(c * kVec + j);
      }
    }
    if (flip != 0) out[c] ^= Word(flip);
  }
  __syncthreads();
  const int listed = list_size;
  if (listed <= kListCapacity) {
    take_from_list<kBlockThreads>(list, listed, adding, temp.scan, histogram[0], shared_int, prefix, prefix_mask,
                                  remaining, out);
    return;
  }

  // More than kListCapacity candidates in the bin (a row of near-equal probabilities): the later
  // digits by passes over the row.
  for (int pass = 1; pass < kRadixPasses; ++pass) {
    int* bins = histogram[0];
    for (int i = threadIdx.x; i < kRadixBins; i += kBlockThreads) bins[i] = 0;
    __syncthreads();
#pragma unroll 2
    for (int64_t c = threadIdx.x; c < chunks; c += kBlockThreads) {
      float p[kVec];
      uint32_t flags;
      load_chunk<kVec>(probs, chosen, c, p, flags);
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        if (chunk_flag(flags, j) == adding) continue;  // not a candidate
        const uint32_t key = rank_key(p[j], adding);
        if ((key & prefix_mask) == prefix) atomicAdd(&bins[(key >> radix_shift(pass)) & radix_mask(pass)], 1);
      }
    }
    __syncthreads();
    take_digit<kBlockThreads>(bins, pass, temp.scan, shared_int, prefix, prefix_mask, remaining);
  }
  const uint32_t threshold = prefix;  // `remaining` candidates with exactly this key are taken

  // Every candidate of the bin above the threshold flips (those above the bin did already); of
  // those at it, the first `remaining` in tie order: token order when adding, reversed when
  // dropping (chunks from the last, each one's tokens from its last).
  auto flips_past_threshold = [&](uint32_t key, bool candidate) {
    return candidate && key > threshold && (key & bin_mask) == bin_prefix;
  };
  int taken_ties = 0;
  for (int64_t base = 0; base < chunks; base += kBlockThreads) {
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
      above |= uint32_t(flips_past_threshold(key, candidate)) << j;
      tie |= uint32_t(candidate && key == threshold) << j;
      my_ties += candidate && key == threshold;
    }
    int rank, ties;
    Scan(temp.scan).ExclusiveSum(my_ties, rank, ties);
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
    if (taken_ties >= remaining && base + kBlockThreads < chunks) {
      // Only keys above the threshold remain to flip: finish without the scan.
      for (int64_t k = base + kBlockThreads + threadIdx.x; k < chunks; k += kBlockThreads) {
        const int64_t u = adding ? k : chunks - 1 - k;
        load_chunk<kVec>(probs, chosen, u, p, flags);
        uint32_t rest = 0;
#pragma unroll
        for (int j = 0; j < kVec; ++j)
          rest |= uint32_t(flips_past_threshold(rank_key(p[j], adding), chunk_flag(flags, j) != adding)) << (8 * j);
        if (rest != 0) out[u] ^= Word(rest);
      }
      break;
    }
  }
}

// The layout works on chunks of 32 tokens: a chunk's assignment for expert e is one 32-bit mask
// (bit j: token 32 c + j), and every position follows from popcounts of the masks and two
// prefixes, so the (E, T) row scratch, the per-expert and per-token row walks and the fills of
// v1 (ten launches, ~67 µs at T 16384, E 512 on the H200) are three launches.
constexpr int kChunk = 32;  // tokens per chunk: one mask bit each
static_assert(kChunk == 32, "a chunk's tokens are the lanes of a warp");
constexpr int kMaxExpertGroups = kMaxRouterExperts / 32;  // 32 experts per group
// The entries kernel: 256 threads, 4 blocks per SM (64 registers), so that T 16384's 512 chunks
// run in one wave (512 threads at 52 registers ran two).
constexpr int kEntriesThreads = 256;
constexpr int kExpertsPerThread = kMaxRouterExperts / kEntriesThreads;
static_assert(kExpertsPerThread * kEntriesThreads == kMaxRouterExperts, "whole experts per thread");
constexpr int kPairBatch = 8;  // experts whose pairs a warp of the entries kernel loads at once

// Bits 0..3 of the result are bytes 0..3 of w, each 0 or 1 (a bool): the multiply moves byte i
// to bit 21 + i with no other term landing in bits 21..24.
__device__ __forceinline__ uint32_t bool_bytes_to_bits(uint32_t w) { return ((w * 0x204081u) >> 21) & 0xfu; }

// masks[c * E + e]: expert e's 32 tokens of chunk c (chunk-major, so that each block of the
// entries kernel reads its chunk's row contiguously); chunk_totals[c]: the chunk's pairs. Thread
// per expert: each reads its 32 bytes of row e, one sector (two 16-byte loads where kAligned:
// T % 16 == 0 and a 16-byte aligned base).
template <bool kAligned>
__global__ void __launch_bounds__(kThreads)
layout_masks_kernel(const uint8_t* __restrict__ assigned_t, int64_t num_tokens, int num_experts,
                    uint32_t* __restrict__ masks, int32_t* __restrict__ chunk_totals) {
  __shared__ typename BlockReduce::TempStorage temp;
  const int64_t T = num_tokens, c = blockIdx.x, t0 = c * kChunk;
  const bool whole = t0 + kChunk <= T;
  int pairs = 0;
  for (int e = threadIdx.x; e < num_experts; e += kThreads) {
    const uint8_t* flags = assigned_t + e * T + t0;
    uint32_t mask = 0;
    if (kAligned && whole) {
      const uint4 lo = reinterpret_cast<const uint4*>(flags)[0], hi = reinterpret_cast<const uint4*>(flags)[1];
      const uint32_t words[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
      for (int i = 0; i < 8; ++i) mask |= bool_bytes_to_bits(words[i]) << (4 * i);
    } else {
      for (int j = 0; j < kChunk && t0 + j < T; ++j) mask |= uint32_t(flags[j] != 0) << j;
    }
    masks[c * num_experts + e] = mask;
    pairs += __popc(mask);
  }
  const int total = BlockReduce(temp).Sum(pairs);
  if (threadIdx.x == 0) chunk_totals[c] = total;
}

// out[0] = 0, out[i + 1] = in[0] + ... + in[i], for any n, by the whole block (a carried loop).
__device__ void block_exclusive_scan(const int32_t* __restrict__ in, int64_t n, int32_t* __restrict__ out) {
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

// Blocks 0 .. G-1, one per group of 32 experts (lane = expert): row_prefix[c * E + e] = expert
// e's tokens in chunks before c, and expert_totals[e]. Warp w walks a contiguous range of
// chunks (coalesced along the group), the warps' sums are scanned through shared memory, and
// the range is walked again writing the prefix. The last block: token_prefix = the exclusive
// scan of chunk_totals (token_prefix[C] = M, the pairs).
__global__ void __launch_bounds__(kScanThreads)
layout_prefix_kernel(const uint32_t* __restrict__ masks, const int32_t* __restrict__ chunk_totals,
                     int64_t num_chunks, int num_experts, int32_t* __restrict__ row_prefix,
                     int32_t* __restrict__ expert_totals, int32_t* __restrict__ token_prefix) {
  if (blockIdx.x == gridDim.x - 1) {
    block_exclusive_scan(chunk_totals, num_chunks, token_prefix);
    return;
  }
  constexpr int kWarps = kScanThreads / 32;
  __shared__ int warp_sums[kWarps][33];  // padded: lane l of each warp reads column l
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int e = blockIdx.x * 32 + lane;
  const bool valid = e < num_experts;
  const int64_t per_warp = (num_chunks + kWarps - 1) / kWarps;
  const int64_t c0 = warp * per_warp, c1 = min(num_chunks, c0 + per_warp);
  int sum = 0;
  if (valid) {
#pragma unroll 8
    for (int64_t c = c0; c < c1; ++c) sum += __popc(masks[c * num_experts + e]);
  }
  warp_sums[warp][lane] = sum;
  __syncthreads();
  int before = 0, total = 0;
  for (int w = 0; w < kWarps; ++w) {
    const int v = warp_sums[w][lane];
    before += w < warp ? v : 0;
    total += v;
  }
  if (!valid) return;
  if (warp == 0) expert_totals[e] = total;
#pragma unroll 8
  for (int64_t c = c0; c < c1; ++c) {
    row_prefix[c * num_experts + e] = before;
    before += __popc(masks[c * num_experts + e]);
  }
}

// One block per chunk. Expert e's pairs in the chunk take consecutive sorted rows from
// expert_offsets[e] + row_prefix; token t's entries list its experts in order from token_prefix
// plus the chunk's tokens before it. A warp per expert (lane = token) writes gather_idx and
// sorted_scores along the rows and reads the scores coalesced; the entry of (t, e) counts t's
// experts before e through the chunk's transposed masks (per group of 32 experts, bit l: expert
// 32 g + l). Block 0 writes expert_offsets; the blocks zero [M, row_bound) of the four buffers.
// A pair past row_bound (a bound below M, which the layer never passes) is not written.
__global__ void __launch_bounds__(kEntriesThreads, 4)
layout_entries_kernel(const uint32_t* __restrict__ masks, const int32_t* __restrict__ row_prefix,
                      const int32_t* __restrict__ expert_totals, const int32_t* __restrict__ token_prefix,
                      const float* __restrict__ scores_t, int64_t num_tokens, int num_experts,
                      int64_t row_bound, int32_t* __restrict__ expert_offsets,
                      int32_t* __restrict__ gather_idx, float* __restrict__ sorted_scores,
                      int32_t* __restrict__ token_offsets, int32_t* __restrict__ rows,
                      float* __restrict__ row_scores) {
  using EntriesScan = cub::BlockScan<int, kEntriesThreads>;
  __shared__ typename EntriesScan::TempStorage scan;
  __shared__ uint32_t chunk_mask[kMaxRouterExperts];        // expert -> its tokens in the chunk
  __shared__ int first_row[kMaxRouterExperts];              // expert -> its chunk's first row
  __shared__ uint32_t token_mask[kMaxExpertGroups][kChunk]; // (group, token) -> its experts
  __shared__ int first_entry[kMaxExpertGroups][kChunk];     // (group, token) -> first entry
  const int64_t T = num_tokens, C = gridDim.x, c = blockIdx.x, t0 = c * kChunk;
  const int E = num_experts, groups = (E + 31) / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  // Every global read of the set-up at once: one round trip where three followed each other.
  int totals[kExpertsPerThread], offsets[kExpertsPerThread], prefix[kExpertsPerThread], pairs;
  uint32_t mask[kExpertsPerThread];
  const int chunk_first_entry = token_prefix[c];
#pragma unroll
  for (int i = 0; i < kExpertsPerThread; ++i) {
    const int e = threadIdx.x * kExpertsPerThread + i;
    totals[i] = e < E ? expert_totals[e] : 0;
    mask[i] = e < E ? masks[c * E + e] : 0u;
    prefix[i] = e < E ? row_prefix[c * E + e] : 0;
  }
  EntriesScan(scan).ExclusiveSum(totals, offsets, pairs);
#pragma unroll
  for (int i = 0; i < kExpertsPerThread; ++i) {
    const int e = threadIdx.x * kExpertsPerThread + i;
    if (e >= E) continue;
    chunk_mask[e] = mask[i];
    first_row[e] = offsets[i] + prefix[i];
    if (c == 0) expert_offsets[e] = offsets[i];
  }
  if (c == 0 && threadIdx.x == 0) expert_offsets[E] = pairs;
  __syncthreads();

  for (int g = warp; g < groups; g += kEntriesThreads / 32) {  // transpose: 32 ballots per group
    const int e = g * 32 + lane;
    const uint32_t m = e < E ? chunk_mask[e] : 0u;
    uint32_t mine = 0;
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      const uint32_t experts = __ballot_sync(0xffffffffu, (m >> j) & 1u);
      if (lane == j) mine = experts;
    }
    token_mask[g][lane] = mine;
  }
  __syncthreads();
  if (warp == 0) {  // lane = token: its entry count, then the chunk's exclusive scan of them
    int count = 0;
    for (int g = 0; g < groups; ++g) {
      first_entry[g][lane] = count;
      count += __popc(token_mask[g][lane]);
    }
    int inclusive = count;
#pragma unroll
    for (int s = 1; s < 32; s *= 2) {
      const int v = __shfl_up_sync(0xffffffffu, inclusive, s);
      if (lane >= s) inclusive += v;
    }
    const int first = chunk_first_entry + inclusive - count;
    for (int g = 0; g < groups; ++g) first_entry[g][lane] += first;
    if (t0 + lane < T) token_offsets[t0 + lane] = first;
    if (c == C - 1 && lane == 0) token_offsets[T] = pairs;
  }
  __syncthreads();

  // kPairBatch experts per warp at a time: their scores load together (one at a time, each
  // warp waited out a load per expert: 25.9 µs at T 16384, E 512).
  constexpr int kWarps = kEntriesThreads / 32;
  const uint32_t lanes_below = (1u << lane) - 1u;
  const int64_t t = t0 + lane;
  for (int e0 = warp; e0 < E; e0 += kWarps * kPairBatch) {
    bool mine[kPairBatch];
    float score[kPairBatch];
#pragma unroll
    for (int b = 0; b < kPairBatch; ++b) {
      const int e = e0 + b * kWarps;
      mine[b] = e < E && ((chunk_mask[e] >> lane) & 1u);
      score[b] = mine[b] ? scores_t[e * T + t] : 0.f;
    }
#pragma unroll
    for (int b = 0; b < kPairBatch; ++b) {
      if (!mine[b]) continue;
      const int e = e0 + b * kWarps, g = e / 32;
      const int row = first_row[e] + __popc(chunk_mask[e] & lanes_below);
      const int entry = first_entry[g][lane] + __popc(token_mask[g][lane] & ((1u << (e % 32)) - 1u));
      if (row < row_bound) {
        gather_idx[row] = static_cast<int32_t>(t);
        sorted_scores[row] = score[b];
      }
      if (entry < row_bound) {
        rows[entry] = row;
        row_scores[entry] = score[b];
      }
    }
  }
  // Past the M pairs: token 0, row 0, score 0 (DenseRoutingMetadata).
  for (int64_t i = pairs + c * kEntriesThreads + threadIdx.x; i < row_bound; i += C * kEntriesThreads) {
    gather_idx[i] = 0;
    sorted_scores[i] = 0.f;
    rows[i] = 0;
    row_scores[i] = 0.f;
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
  auto launch = [&](auto kernel, int threads) {
    kernel<<<p.num_experts, threads, 0, p.stream>>>(p.probs_t, p.chosen_t, p.num_tokens, p.tile, p.rule, p.assigned_t,
                                                   p.counts);
  };
  // Each pass over a row is a chain of loads per thread, which 1024 threads halve. At 64 registers
  // one such block fits an SM (two of 512): the wide block where the experts fit one per SM.
  const bool wide = p.num_experts <= 128;
  if (vec4 && wide) launch(token_rounding_assign_kernel<4, 1024>, 1024);
  else if (vec4) launch(token_rounding_assign_kernel<4, kThreads>, kThreads);
  else if (wide) launch(token_rounding_assign_kernel<1, 1024>, 1024);
  else launch(token_rounding_assign_kernel<1, kThreads>, kThreads);
  SONICMOE_CUDA_TRY(cudaGetLastError());
  return Status::success();
}

std::string check_dense_layout(const DenseLayoutParams& p) {
  auto rule = [](const char* name, int64_t v, const char* r) { return rule_message("dense_layout", name, v, r); };
  if (p.num_experts < 1 || p.num_experts > kMaxRouterExperts)
    return rule("num_experts", p.num_experts, "must be in [1, 1024]");
  if (p.num_tokens < 0 || p.num_tokens * p.num_experts > INT32_MAX)
    return rule("num_tokens", p.num_tokens, "num_tokens * num_experts must fit in int32");
  if (p.row_bound < 0 || p.row_bound > INT32_MAX) return rule("row_bound", p.row_bound, "must be in [0, 2^31 - 1]");
  return {};
}

namespace {

// The layout's scratch: masks and row_prefix (C x E each), expert_totals (E), chunk_totals (C),
// token_prefix (C + 1), with C = ceil(T / 32).
struct LayoutWorkspace {
  uint32_t* masks;
  int32_t* row_prefix;
  int32_t* expert_totals;
  int32_t* chunk_totals;
  int32_t* token_prefix;
};
int64_t layout_chunks(int64_t num_tokens) { return (num_tokens + kChunk - 1) / kChunk; }
LayoutWorkspace carve_layout_workspace(void* base, int64_t num_tokens, int num_experts) {
  const int64_t C = layout_chunks(num_tokens);
  LayoutWorkspace w;
  w.masks = static_cast<uint32_t*>(base);
  w.row_prefix = reinterpret_cast<int32_t*>(w.masks + C * num_experts);
  w.expert_totals = w.row_prefix + C * num_experts;
  w.chunk_totals = w.expert_totals + num_experts;
  w.token_prefix = w.chunk_totals + C;
  return w;
}

}  // namespace

size_t dense_layout_workspace_size(int64_t num_tokens, int num_experts) {
  const size_t C = size_t(layout_chunks(num_tokens));
  return sizeof(int32_t) * (2 * C * size_t(num_experts) + size_t(num_experts) + 2 * C + 1);
}

Status run_dense_layout(const DenseLayoutParams& p) {
  const std::string problem = check_dense_layout(p);
  if (!problem.empty()) return Status::error(problem);
  if (p.expert_offsets == nullptr || p.token_offsets == nullptr ||
      (p.num_tokens > 0 && (p.assigned_t == nullptr || p.scores_t == nullptr || p.workspace == nullptr)) ||
      (p.row_bound > 0 && (p.gather_idx == nullptr || p.sorted_scores == nullptr || p.rows == nullptr ||
                           p.row_scores == nullptr)))
    return Status::error("dense_layout: assigned_t, scores_t, the outputs and workspace must be non-null");
  if (p.workspace_bytes < dense_layout_workspace_size(p.num_tokens, p.num_experts))
    return Status::error("dense_layout: workspace smaller than dense_layout_workspace_size()");
  const int64_t T = p.num_tokens, C = layout_chunks(T);
  if (T == 0) {
    SONICMOE_CUDA_TRY(cudaMemsetAsync(p.expert_offsets, 0, sizeof(int32_t) * (p.num_experts + 1), p.stream));
    SONICMOE_CUDA_TRY(cudaMemsetAsync(p.token_offsets, 0, sizeof(int32_t), p.stream));
    for (void* buffer : {static_cast<void*>(p.gather_idx), static_cast<void*>(p.sorted_scores),
                         static_cast<void*>(p.rows), static_cast<void*>(p.row_scores)})
      if (p.row_bound > 0) SONICMOE_CUDA_TRY(cudaMemsetAsync(buffer, 0, 4 * size_t(p.row_bound), p.stream));
    return Status::success();
  }
  const LayoutWorkspace w = carve_layout_workspace(p.workspace, T, p.num_experts);
  const unsigned chunks = static_cast<unsigned>(C);
  const bool aligned = T % 16 == 0 && reinterpret_cast<uintptr_t>(p.assigned_t) % 16 == 0;
  if (aligned)
    layout_masks_kernel<true><<<chunks, kThreads, 0, p.stream>>>(p.assigned_t, T, p.num_experts, w.masks,
                                                                 w.chunk_totals);
  else
    layout_masks_kernel<false><<<chunks, kThreads, 0, p.stream>>>(p.assigned_t, T, p.num_experts, w.masks,
                                                                  w.chunk_totals);
  SONICMOE_CUDA_TRY(cudaGetLastError());
  const int groups = (p.num_experts + 31) / 32;
  layout_prefix_kernel<<<groups + 1, kScanThreads, 0, p.stream>>>(w.masks, w.chunk_totals, C, p.num_experts,
                                                                  w.row_prefix, w.expert_totals, w.token_prefix);
  SONICMOE_CUDA_TRY(cudaGetLastError());
  layout_entries_kernel<<<chunks, kEntriesThreads, 0, p.stream>>>(
      w.masks, w.row_prefix, w.expert_totals, w.token_prefix, p.scores_t, T, p.num_experts, p.row_bound,
      p.expert_offsets, p.gather_idx, p.sorted_scores, p.token_offsets, p.rows, p.row_scores);
  SONICMOE_CUDA_TRY(cudaGetLastError());
  return Status::success();
}

}  // namespace sonicmoe
