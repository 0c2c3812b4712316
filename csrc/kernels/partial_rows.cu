// Zeros on the first rows past expert_offsets[E] of an upper-bound buffer (partial_rows), which
// the weight gradients' TMA boxes read (sonicmoe.h, run_zero_rows_past_end). Plain CUDA.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "common/cuda_check.h"
#include "common/host_rules.h"
#include "sonicmoe.h"

namespace sonicmoe {
namespace {

constexpr int kThreads = 256;

struct ZeroTargets {  // by value in the launch: buffer blockIdx.y of the grid
  uint4* data[kMaxBuffersZeroedPastEnd];
  int64_t row_vecs[kMaxBuffersZeroedPastEnd];
};

__global__ void __launch_bounds__(kThreads)
zero_rows_past_end_kernel(const int32_t* __restrict__ end_row, ZeroTargets targets, int64_t rows, int count) {
  uint4* __restrict__ data = targets.data[blockIdx.y];
  const int64_t row_vecs = targets.row_vecs[blockIdx.y];
  const int64_t first = *end_row;
  const int64_t last = first + count < rows ? first + count : rows;
  const int64_t vecs = (last - first) * row_vecs;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < vecs; i += int64_t(gridDim.x) * kThreads)
    data[first * row_vecs + i] = make_uint4(0, 0, 0, 0);
}

}  // namespace

Status run_zero_rows_past_end(const int32_t* end_row, int64_t rows, int count,
                              std::initializer_list<RowMajorBuffer> buffers, cudaStream_t stream) {
  if (rows == 0 || count <= 0 || buffers.size() == 0) return Status::success();
  if (buffers.size() > kMaxBuffersZeroedPastEnd)
    return Status::error(rule_message("zero_rows_past_end", "buffers", static_cast<int64_t>(buffers.size()),
                                      "must be at most " + std::to_string(kMaxBuffersZeroedPastEnd) + " per launch"));
  ZeroTargets targets{};
  int64_t most_vecs = 0;
  int b = 0;
  for (const RowMajorBuffer& buf : buffers) {
    if (end_row == nullptr || buf.data == nullptr)
      return Status::error("zero_rows_past_end: end_row and data must be non-null");
    if (buf.row_bytes <= 0 || buf.row_bytes % 16 != 0 || reinterpret_cast<uintptr_t>(buf.data) % 16 != 0)
      return Status::error("zero_rows_past_end: rows must be whole 16-byte vectors and data 16-byte aligned");
    targets.data[b] = static_cast<uint4*>(buf.data);
    targets.row_vecs[b] = buf.row_bytes / 16;
    most_vecs = std::max(most_vecs, int64_t(count) * targets.row_vecs[b]);
    ++b;
  }
  const int64_t blocks = std::min<int64_t>((most_vecs + kThreads - 1) / kThreads, 1024);
  zero_rows_past_end_kernel<<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(b)), kThreads, 0, stream>>>(
      end_row, targets, rows, count);
  SONICMOE_CUDA_TRY(cudaGetLastError());
  return Status::success();
}

}  // namespace sonicmoe
