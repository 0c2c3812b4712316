// Host side of the kernels' TMA descriptors (sm90 and sm100: the same cp.async.bulk.tensor loads):
// the driver's encoder through the runtime, bf16 row-major matrices and the expert weights.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "common/cuda_check.h"
#include "sonicmoe.h"

namespace sonicmoe {

// The driver's cuTensorMapEncodeTiled through the runtime's entry-point query, so the library
// needs no link against libcuda.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      f = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// A bf16 tensor of `rank` dims (innermost first, contiguous innermost), loaded in boxes of
// `box` elements with the 128-byte swizzle the WGMMA shared-memory layouts expect.
inline Status make_bf16_tensor_map(CUtensorMap* map, const void* base, int rank,
                                   const uint64_t* dims, const uint64_t* byte_strides,
                                   const uint32_t* box, const char* what) {
  auto encode = tensor_map_encoder();
  if (encode == nullptr) return Status::error("grouped GEMM: cuTensorMapEncodeTiled is unavailable");
  // The driver call needs the device's context current in this thread. A thread whose first
  // CUDA work is ours has none (autograd's backward thread, when a backward starts with our
  // op: CUresult 201), and torch's device guard skips cudaSetDevice when the index already
  // matches; cudaSetDevice binds the primary context.
  int device = 0;
  SONICMOE_CUDA_TRY(cudaGetDevice(&device));
  SONICMOE_CUDA_TRY(cudaSetDevice(device));
  cuuint64_t d[3], s[2];
  cuuint32_t b[3], e[3];
  for (int i = 0; i < rank; ++i) {
    d[i] = dims[i];
    b[i] = box[i];
    e[i] = 1;
    if (i + 1 < rank) s[i] = byte_strides[i];
  }
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rank, const_cast<void*>(base), d,
                            s, b, e, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return Status::error(std::string("grouped GEMM: cuTensorMapEncodeTiled failed for ") + what +
                         " (CUresult " + std::to_string(static_cast<int>(r)) + ")");
  return Status::success();
}

// A row-major (rows, cols) bf16 matrix as a (cols, rows) TMA tensor in boxes of box_cols x box_rows.
inline Status make_row_major_tensor_map(CUtensorMap* map, const void* base, int64_t rows, int64_t cols,
                                        uint32_t box_cols, uint32_t box_rows, const char* what) {
  const uint64_t dims[2] = {uint64_t(cols), uint64_t(rows)};
  const uint64_t strides[1] = {uint64_t(cols) * 2};
  const uint32_t box[2] = {box_cols, box_rows};
  return make_bf16_tensor_map(map, base, 2, dims, strides, box, what);
}

// The expert weights as a 3-D TMA tensor in boxes of 64 N columns x kTileK:
// K-major (E, n_cols, k) as (k, n_cols, E); N-major (E, k, n_cols) as (n_cols, k, E).
template <class Mainloop>
Status make_weight_tensor_map(CUtensorMap* map, const void* w, int64_t n_cols, int64_t k, int num_experts) {
  const uint64_t inner = Mainloop::kKMajorB ? k : n_cols, outer = Mainloop::kKMajorB ? n_cols : k;
  const uint64_t dims[3] = {inner, outer, uint64_t(num_experts)};
  const uint64_t strides[2] = {inner * 2, inner * outer * 2};
  const uint32_t box[3] = {Mainloop::kKMajorB ? uint32_t(Mainloop::kTileK) : uint32_t(Mainloop::kBoxRowsB),
                           Mainloop::kKMajorB ? uint32_t(Mainloop::kBoxRowsB) : uint32_t(Mainloop::kTileK), 1};
  return make_bf16_tensor_map(map, w, 3, dims, strides, box, "the weights");
}

}  // namespace sonicmoe
