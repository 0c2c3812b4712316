// CUDA return-code checks for the kernel library (torch-free).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "sonicmoe.h"

namespace sonicmoe {

inline Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::success();
  return Status::error(std::string(what) + ": " + cudaGetErrorName(err) + " (" +
                       cudaGetErrorString(err) + ")");
}

}  // namespace sonicmoe

// Returns a Status from the enclosing function when a CUDA call fails.
#define SONICMOE_CUDA_TRY(expr)                                        \
  do {                                                                 \
    ::sonicmoe::Status _st = ::sonicmoe::cuda_status((expr), #expr);   \
    if (!_st.ok()) return _st;                                         \
  } while (0)

#define SONICMOE_TRY(expr)                 \
  do {                                     \
    ::sonicmoe::Status _st = (expr);       \
    if (!_st.ok()) return _st;             \
  } while (0)
