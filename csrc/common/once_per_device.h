// A setup step that runs once per device and kernel (a shared-memory opt-in, a driver query),
// its result cached: calling it on every launch costs host time.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>

#include "common/cuda_check.h"

namespace sonicmoe {

// *value = the result (> 0) of prepare(int* result) -> Status, run on the first call for the
// current device and cached for it. kKernel (the kernel's address) keys the cache: one per kernel
// instantiation, whatever its signature. Devices past the cache's 64 run prepare every time.
// (A cudaDeviceReset would drop an opt-in behind the cache's back; nothing here resets.)
template <auto kKernel, class Prepare>
Status once_per_device(int* value, Prepare prepare) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices];  // 0: not yet
  int device = 0;
  SONICMOE_CUDA_TRY(cudaGetDevice(&device));
  if (device < kMaxDevices) {
    const int v = cached[device].load(std::memory_order_acquire);
    if (v > 0) {
      *value = v;
      return Status::success();
    }
  }
  int v = 0;
  SONICMOE_TRY(prepare(&v));
  if (v < 1) return Status::error("once_per_device: the setup step's result must be > 0");
  if (device < kMaxDevices) cached[device].store(v, std::memory_order_release);
  *value = v;
  return Status::success();
}

}  // namespace sonicmoe
