// Zeros on the first rows past expert_offsets[E] of an upper-bound buffer (partial_rows), which
// the weight gradients' TMA boxes read (sonicmoe.h, run_zero_rows_past_end). Plain CUDA.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/cuda_check.h"
#include "sonicmoe.h"

namespace sonicmoe {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
zero_rows_past_end_kernel(const int32_t* __restrict__ end_row, uint4* __restrict__ data, int64_t rows,
                          int64_t row_vecs, int count) {
  const int64_t first = *end_row;
  const int64_t last = first + count < rows ? first + count : rows;
  const int64_t vecs = (last - first) * row_vecs;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < vecs; i += int64_t(gridDim.x) * kThreads)
    data[first * row_vecs + i] = make_uint4(0, 0, 0, 0);
}

}  // namespace

Status run_zero_rows_past_end(const int32_t* end_row, void* data, int64_t rows, int64_t row_bytes, int count,
                              cudaStream_t stream) {
  if (rows == 0 || count <= 0) return Status::success();
  if (end_row == nullptr || data == nullptr) return Status::error("zero_rows_past_end: end_row and data must be non-null");
  if (row_bytes <= 0 || row_bytes % 16 != 0 || reinterpret_cast<uintptr_t>(data) % 16 != 0)
    return Status::error("zero_rows_past_end: rows must be whole 16-byte vectors and data 16-byte aligned");
  const int64_t row_vecs = row_bytes / 16;
  const int64_t blocks = (int64_t(count) * row_vecs + kThreads - 1) / kThreads;
  zero_rows_past_end_kernel<<<static_cast<unsigned>(blocks < 1024 ? blocks : 1024), kThreads, 0, stream>>>(
      end_row, static_cast<uint4*>(data), rows, row_vecs, count);
  SONICMOE_CUDA_TRY(cudaGetLastError());
  return Status::success();
}

}  // namespace sonicmoe
