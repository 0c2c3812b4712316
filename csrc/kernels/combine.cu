// K3 combine: out[t] = sum_k s[t,k] * y[rev_idx[t,k]]; K8 combine_dx: dx[t] = addend[t] + sum_k
// dx_rows[rev_idx[t,k]]; combine_csr: token rounding's variable entries per token; scatter_rows:
// out[rev_idx[t,k]] = x[t] (dW1's copy of x). Plain CUDA.
//
// One warp per token, each lane 8 consecutive columns (one 16-byte vector) per pass; the sum runs
// over k in a fixed order in fp32 (deterministic, no atomics).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <climits>
#include <cstdint>
#include <cstdio>
#include <string>

#include "common/cuda_check.h"
#include "common/host_rules.h"
#include "common/once_per_device.h"
#include "sonicmoe.h"

namespace sonicmoe {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kVec = 8;         // bf16 per 16-byte vector
constexpr int kMaxTopK = 32;    // one lane holds each (t, k)'s index and score
constexpr int kLoadBatch = 8;   // combine_csr: rows loaded before accumulating (registers: 8 x 16 bytes)
// combine_kernel runs 4 stages while a block's slots, 4 warps x 4 x (top_k + 1) x 512 bytes,
// leave room for two blocks an SM (top_k <= 12: up to 104 KB; three at top_k 8); 2 stages above
// (up to 132 KB at top_k 32).
constexpr int kFourStagesMaxTopK = 12;

// A combine_kernel block's shared memory: per warp and stage, top_k rows and the addend, 32 lanes'
// 16-byte chunks each.
constexpr size_t slots_bytes(int stages, int top_k) {
  return size_t(kWarpsPerBlock) * stages * (top_k + 1) * 32 * sizeof(uint4);
}

__device__ __forceinline__ void accumulate(float (&acc)[kVec], uint4 raw, float s) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < kVec / 2; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    acc[2 * i] = fmaf(s, f.x, acc[2 * i]);
    acc[2 * i + 1] = fmaf(s, f.y, acc[2 * i + 1]);
  }
}

// acc += score * (chunk v of y[row]) for the `count` (row, score) pairs held by lanes 0..count-1
// (broadcast by shuffles), loading kLoadBatch rows before accumulating them in order.
__device__ __forceinline__ void accumulate_rows(float (&acc)[kVec], const uint4* __restrict__ y,
                                                int64_t vecs_per_row, int64_t v, int count, int32_t my_row,
                                                float my_score) {
  for (int k0 = 0; k0 < count; k0 += kLoadBatch) {
    uint4 raw[kLoadBatch];
    float s[kLoadBatch];
#pragma unroll
    for (int j = 0; j < kLoadBatch; ++j) {
      const int k = k0 + j;
      const int32_t row = __shfl_sync(0xffffffff, my_row, k < count ? k : 0);
      s[j] = __shfl_sync(0xffffffff, my_score, k < count ? k : 0);
      raw[j] = (k < count && v < vecs_per_row) ? __ldg(&y[int64_t(row) * vecs_per_row + v])
                                               : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int j = 0; j < kLoadBatch; ++j) {
      if (k0 + j < count) accumulate(acc, raw[j], s[j]);
    }
  }
}

// One 16-byte cp.async (L2 only) from global src to the shared-window address dst. The memory
// clobber keeps the compiler from moving a lane's earlier reads of a stage past the copy that
// refills it (the SASS is the same with and without it).
__device__ __forceinline__ void cp_async_16B(uint32_t dst, const uint4* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}

__device__ __forceinline__ void store_bf16(uint4* dst, const float (&acc)[kVec]) {
  uint4 packed;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&packed);
#pragma unroll
  for (int i = 0; i < kVec / 2; ++i) h[i] = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
  *dst = packed;
}

// K3 (scores), K8 (scores == nullptr: unit weights, the sum starting from addend[t], the router's
// part of dx, when given). Each lane copies its 16-byte chunks by cp.async into its own
// shared-memory slots, kStages - 1 passes of the row ahead of the one it sums, and reads back only
// what it copied, so cp.async.wait_group orders it with no barrier: at top_k 8, 3 blocks of 4 warps
// an SM, each with up to 4 passes of 4.5 KB in flight, on 40 registers. Loads held in registers took
// 69 (28 warps, 112 KB in flight an SM) and ran 1-5% slower alone at top_k 8, 30% at top_k 2
// (H200; beside K5 / K7 both read at the same rate). Lane k holds
// (row, score) of pair (t, k); the others get them by shuffles.
template <int kStages>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
combine_kernel(const uint4* __restrict__ y, const float* __restrict__ scores, const int32_t* __restrict__ rev_idx,
               const uint4* __restrict__ addend, uint4* __restrict__ out, int64_t num_tokens, int top_k,
               int64_t vecs_per_row, int64_t num_rows) {
  extern __shared__ uint4 slots[];  // [warp][stage][top_k + 1][lane]: the rows, then the addend
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int64_t t = int64_t(blockIdx.x) * kWarpsPerBlock + warp;
  if (t >= num_tokens) return;
  const int stage_vecs = (top_k + 1) * 32;
  const uint4* my_slots = slots + warp * kStages * stage_vecs + lane;
  const uint32_t my_slots_smem = static_cast<uint32_t>(__cvta_generic_to_shared(my_slots));

  int32_t my_row = 0;
  float my_score = 1.f;
  if (lane < top_k) {
    my_row = rev_idx[t * top_k + lane];
    if (scores != nullptr) my_score = scores[t * top_k + lane];
    if (my_row < 0 || my_row >= num_rows) {
      printf("sonicmoe combine: rev_idx[%lld, %d] = %d is outside [0, %lld)\n",
             static_cast<long long>(t), lane, my_row, static_cast<long long>(num_rows));
      __trap();
    }
  }
  // Pass i copies chunk lane + 32 i of every row (and of the addend) into stage i % kStages; a
  // lane past the row copies nothing, and every lane commits one group per pass.
  auto issue = [&](int64_t i) {
    const int64_t v = lane + 32 * i;
    const uint32_t stage = my_slots_smem + uint32_t((i % kStages) * stage_vecs * sizeof(uint4));
    for (int k = 0; k < top_k; ++k) {
      const int32_t row = __shfl_sync(0xffffffff, my_row, k);
      if (v < vecs_per_row) cp_async_16B(stage + k * 32 * sizeof(uint4), y + int64_t(row) * vecs_per_row + v);
    }
    if (addend != nullptr && v < vecs_per_row)
      cp_async_16B(stage + top_k * 32 * sizeof(uint4), addend + t * vecs_per_row + v);
    asm volatile("cp.async.commit_group;\n" ::);
  };
  const int64_t passes = (vecs_per_row + 31) / 32;
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) issue(i);
  for (int64_t i = 0; i < passes; ++i) {
    issue(i + kStages - 1);  // an empty group past the last pass
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kStages - 1) : "memory");
    const uint4* stage = my_slots + (i % kStages) * stage_vecs;
    const int64_t v = lane + 32 * i;
    const bool valid = v < vecs_per_row;  // the lane's slots hold this pass's chunks
    float acc[kVec] = {};
    if (addend != nullptr && valid) accumulate(acc, stage[top_k * 32], 1.f);
    for (int k = 0; k < top_k; ++k) {
      const float s = __shfl_sync(0xffffffff, my_score, k);
      if (valid) accumulate(acc, stage[k * 32], s);
    }
    if (valid) store_bf16(&out[t * vecs_per_row + v], acc);
  }
}

// Variable experts per token (token rounding): token t sums entries [token_offsets[t],
// token_offsets[t + 1]) of (rows, row_scores), in that order. The warp walks the entries 32 at a
// time (lane j holds entry j of the batch) and loads kLoadBatch rows before accumulating.
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
combine_csr_kernel(const uint4* __restrict__ y, const float* __restrict__ row_scores,
                   const int32_t* __restrict__ rows, const int32_t* __restrict__ token_offsets,
                   uint4* __restrict__ out, int64_t num_tokens, int64_t vecs_per_row, int64_t num_rows) {
  const int lane = threadIdx.x % 32;
  const int64_t t = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (t >= num_tokens) return;
  const int32_t first = token_offsets[t], last = token_offsets[t + 1];
  if (first > last) __trap();
  for (int64_t v = lane; v - lane < vecs_per_row; v += 32) {
    float acc[kVec] = {};
    for (int32_t base = first; base < last; base += 32) {
      const int count = min(32, last - base);
      int32_t my_row = 0;
      float my_score = 0.f;
      if (lane < count) {
        my_row = rows[base + lane];
        my_score = row_scores[base + lane];
        if (my_row < 0 || my_row >= num_rows) {
          printf("sonicmoe combine_csr: rows[%d] = %d is outside [0, %lld)\n", base + lane, my_row,
                 static_cast<long long>(num_rows));
          __trap();
        }
      }
      accumulate_rows(acc, y, vecs_per_row, v, count, my_row, my_score);
    }
    if (v < vecs_per_row) store_bf16(&out[t * vecs_per_row + v], acc);
  }
}

// scatter_rows: lane k holds row rev_idx[t, k]; each pass loads kScatterPasses of the token's
// 16-byte chunks (one a lane) and stores each to the token's top_k rows. x is read once (2.4 GB
// moved at qwen3-235b-a22b against 4.3 GB for a gather, which reads each row of x top_k times).
constexpr int kScatterPasses = 4;

__global__ void __launch_bounds__(kWarpsPerBlock * 32)
scatter_rows_kernel(const uint4* __restrict__ x, const int32_t* __restrict__ rev_idx, uint4* __restrict__ out,
                    int64_t num_tokens, int top_k, int64_t vecs_per_row) {
  const int lane = threadIdx.x % 32;
  const int64_t t = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (t >= num_tokens) return;
  const int64_t num_rows = num_tokens * top_k;
  int32_t my_row = 0;
  if (lane < top_k) {
    my_row = rev_idx[t * top_k + lane];
    if (my_row < 0 || my_row >= num_rows) {
      printf("sonicmoe scatter_rows: rev_idx[%lld, %d] = %d is outside [0, %lld)\n",
             static_cast<long long>(t), lane, my_row, static_cast<long long>(num_rows));
      __trap();
    }
  }
  for (int64_t v0 = lane; v0 - lane < vecs_per_row; v0 += 32 * kScatterPasses) {
    uint4 chunk[kScatterPasses];
#pragma unroll
    for (int j = 0; j < kScatterPasses; ++j) {
      const int64_t v = v0 + 32 * j;
      if (v < vecs_per_row) chunk[j] = __ldg(&x[t * vecs_per_row + v]);
    }
    for (int k = 0; k < top_k; ++k) {
      const int64_t row = __shfl_sync(0xffffffff, my_row, k);
#pragma unroll
      for (int j = 0; j < kScatterPasses; ++j) {
        const int64_t v = v0 + 32 * j;
        if (v < vecs_per_row) out[row * vecs_per_row + v] = chunk[j];
      }
    }
  }
}

std::string value_rule(const char* name, int64_t value, const char* rule) {
  return rule_message("combine", name, value, rule);
}

// The rules K3 (combine) and K8 (combine_dx) share.
std::string check_gather_sum(const char* op, int64_t num_tokens, int top_k, int64_t d, int64_t num_rows) {
  if (num_tokens < 0 || num_tokens > INT_MAX * int64_t(kWarpsPerBlock))
    return rule_message(op, "num_tokens", num_tokens, "must be in [0, 2^33)");
  if (top_k < 1 || top_k > kMaxTopK) return rule_message(op, "top_k", top_k, "must be in [1, 32]");
  if (d < kVec || d % kVec != 0)
    return rule_message(op, "d", d, "must be a positive multiple of 8 (16-byte vectors)");
  if (num_rows < 0 || num_rows > INT32_MAX)
    return rule_message(op, "num_rows", num_rows, "must be in [0, 2^31 - 1] (int32 rev_idx)");
  return {};
}

// K3's and K8's launch, after their checks, on kStages stages for top_k up to kMaxK. The slots pass
// the 48 KB default from top_k 5 (4 stages): it opts in once per device to the most kMaxK needs.
template <int kStages, int kMaxK>
Status launch_combine_stages(const void* y, const float* scores, const int32_t* rev_idx, const void* addend,
                             void* out, int64_t num_tokens, int top_k, int64_t d, int64_t num_rows,
                             cudaStream_t stream) {
  constexpr auto kernel = &combine_kernel<kStages>;
  constexpr size_t kMostSmem = slots_bytes(kStages, kMaxK);
  static_assert(kMostSmem <= 227 * 1024, "more shared memory than an sm90 block may use");
  int opted_in = 0;
  SONICMOE_TRY(once_per_device<kernel>(&opted_in, [&](int* done) -> Status {
    SONICMOE_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kMostSmem)));
    *done = 1;
    return Status::success();
  }));
  const int64_t blocks = (num_tokens + kWarpsPerBlock - 1) / kWarpsPerBlock;
  kernel<<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, slots_bytes(kStages, top_k), stream>>>(
      static_cast<const uint4*>(y), scores, rev_idx, static_cast<const uint4*>(addend), static_cast<uint4*>(out),
      num_tokens, top_k, d / kVec, num_rows);
  SONICMOE_CUDA_TRY(cudaGetLastError());
  return Status::success();
}

Status launch_combine(const void* y, const float* scores, const int32_t* rev_idx, const void* addend, void* out,
                      int64_t num_tokens, int top_k, int64_t d, int64_t num_rows, cudaStream_t stream) {
  return top_k <= kFourStagesMaxTopK
             ? launch_combine_stages<4, kFourStagesMaxTopK>(y, scores, rev_idx, addend, out, num_tokens, top_k, d,
                                                           num_rows, stream)
             : launch_combine_stages<2, kMaxTopK>(y, scores, rev_idx, addend, out, num_tokens, top_k, d, num_rows,
                                                  stream);
}

}  // namespace

std::string check_combine(const CombineParams& p) {
  return check_gather_sum("combine", p.num_tokens, p.top_k, p.d, p.num_rows);
}

Status run_combine(const CombineParams& p) {
  std::string problem = check_combine(p);
  if (!problem.empty()) return Status::error(problem);
  if (p.num_tokens == 0) return Status::success();
  if (p.y == nullptr || p.scores == nullptr || p.rev_idx == nullptr || p.out == nullptr)
    return Status::error("combine: y, scores, rev_idx and out must be non-null");
  if (reinterpret_cast<uintptr_t>(p.y) % 16 || reinterpret_cast<uintptr_t>(p.out) % 16)
    return Status::error("combine: y and out must be 16-byte aligned");
  return launch_combine(p.y, p.scores, p.rev_idx, nullptr, p.out, p.num_tokens, p.top_k, p.d, p.num_rows, p.stream);
}

std::string check_scatter_rows(const ScatterRowsParams& p) {
  std::string problem = check_gather_sum("scatter_rows", p.num_tokens, p.top_k, p.d, 0);
  if (problem.empty() && p.num_tokens * p.top_k > INT32_MAX)
    problem = rule_message("scatter_rows", "num_tokens * top_k", p.num_tokens * p.top_k,
                           "must be in [0, 2^31 - 1] (int32 rev_idx)");
  return problem;
}

Status run_scatter_rows(const ScatterRowsParams& p) {
  std::string problem = check_scatter_rows(p);
  if (!problem.empty()) return Status::error(problem);
  if (p.num_tokens == 0) return Status::success();
  if (p.x == nullptr || p.rev_idx == nullptr || p.out == nullptr)
    return Status::error("scatter_rows: x, rev_idx and out must be non-null");
  if (!aligned16(p.x) || !aligned16(p.out)) return Status::error("scatter_rows: x and out must be 16-byte aligned");
  const int64_t blocks = (p.num_tokens + kWarpsPerBlock - 1) / kWarpsPerBlock;
  scatter_rows_kernel<<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, 0, p.stream>>>(
      static_cast<const uint4*>(p.x), p.rev_idx, static_cast<uint4*>(p.out), p.num_tokens, p.top_k, p.d / kVec);
  SONICMOE_CUDA_TRY(cudaGetLastError());
  return Status::success();
}

std::string check_combine_dx(const CombineDxParams& p) {
  return check_gather_sum("combine_dx", p.num_tokens, p.top_k, p.d, p.num_rows);
}

Status run_combine_dx(const CombineDxParams& p) {
  std::string problem = check_combine_dx(p);
  if (!problem.empty()) return Status::error(problem);
  if (p.num_tokens == 0) return Status::success();
  if (p.dx_rows == nullptr || p.rev_idx == nullptr || p.out == nullptr)
    return Status::error("combine_dx: dx_rows, rev_idx and out must be non-null");
  if (!aligned16(p.dx_rows) || !aligned16(p.out) || (p.addend != nullptr && !aligned16(p.addend)))
    return Status::error("combine_dx: dx_rows, addend and out must be 16-byte aligned");
  return launch_combine(p.dx_rows, nullptr, p.rev_idx, p.addend, p.out, p.num_tokens, p.top_k, p.d, p.num_rows,
                        p.stream);
}

}  // namespace sonicmoe

namespace sonicmoe {

std::string check_combine_csr(const CombineCsrParams& p) {
  if (p.num_tokens < 0 || p.num_tokens > INT_MAX * int64_t(kWarpsPerBlock))
    return value_rule("num_tokens", p.num_tokens, "must be in [0, 2^33)");
  if (p.d < kVec || p.d % kVec != 0)
    return value_rule("d", p.d, "must be a positive multiple of 8 (16-byte vectors)");
  if (p.num_rows < 0 || p.num_rows > INT32_MAX)
    return value_rule("num_rows", p.num_rows, "must be in [0, 2^31 - 1] (int32 rows)");
  return {};
}

Status run_combine_csr(const CombineCsrParams& p) {
  std::string problem = check_combine_csr(p);
  if (!problem.empty()) return Status::error(problem);
  if (p.num_tokens == 0) return Status::success();
  if (p.y == nullptr || p.row_scores == nullptr || p.rows == nullptr || p.token_offsets == nullptr ||
      p.out == nullptr)
    return Status::error("combine: y, row_scores, rows, token_offsets and out must be non-null");
  if (reinterpret_cast<uintptr_t>(p.y) % 16 || reinterpret_cast<uintptr_t>(p.out) % 16)
    return Status::error("combine: y and out must be 16-byte aligned");
  const int64_t blocks = (p.num_tokens + kWarpsPerBlock - 1) / kWarpsPerBlock;
  combine_csr_kernel<<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, 0, p.stream>>>(
      static_cast<const uint4*>(p.y), p.row_scores, p.rows, p.token_offsets, static_cast<uint4*>(p.out),
      p.num_tokens, p.d / kVec, p.num_rows);
  SONICMOE_CUDA_TRY(cudaGetLastError());
  return Status::success();
}

}  // namespace sonicmoe
