// Per-device dispatch: which kernel family (sm90, sm100) an op runs on a GPU, and the error
// where this build holds none for it.
#include <cuda_runtime_api.h>

#include <atomic>
#include <string>

#include "sonicmoe.h"

// CMakeLists.txt sets both from SONICMOE_CUDA_ARCHS.
#if !defined(SONICMOE_HAS_SM90) || !defined(SONICMOE_HAS_SM100)
#error "SONICMOE_HAS_SM90 and SONICMOE_HAS_SM100 must be defined (CMakeLists.txt)"
#endif

namespace sonicmoe {
namespace {

std::string sm_name(int major, int minor) { return "sm_" + std::to_string(major) + std::to_string(minor); }

std::string gpu_text(int major, int minor) {
  return "the GPU is " + sm_name(major, minor) + " (compute capability " + std::to_string(major) + "." +
         std::to_string(minor) + ")";
}

std::string built_text(BuiltArchs built) {
  if (built.sm90 && built.sm100) return "sm_90a and sm_100a kernels";
  if (built.sm100) return "sm_100a kernels only";
  if (built.sm90) return "sm_90a kernels only";
  return "no GPU kernels";
}

// A device's compute capability, read once and cached: every op asks before its launch (a device's
// capability never changes in a process). "" or the query's error.
std::string compute_capability(int device, int* major, int* minor) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices];  // 10 * major + minor + 1; 0: not yet
  if (device >= 0 && device < kMaxDevices) {
    const int v = cached[device].load(std::memory_order_acquire);
    if (v > 0) {
      *major = (v - 1) / 10;
      *minor = (v - 1) % 10;
      return {};
    }
  }
  const cudaError_t e1 = cudaDeviceGetAttribute(major, cudaDevAttrComputeCapabilityMajor, device);
  const cudaError_t e2 = cudaDeviceGetAttribute(minor, cudaDevAttrComputeCapabilityMinor, device);
  if (e1 != cudaSuccess || e2 != cudaSuccess) {
    (void)cudaGetLastError();  // the failed query must not surface at the next launch
    return cudaGetErrorString(e1 != cudaSuccess ? e1 : e2);
  }
  if (device >= 0 && device < kMaxDevices && *minor < 10)
    cached[device].store(10 * *major + *minor + 1, std::memory_order_release);
  return {};
}

}  // namespace

BuiltArchs built_archs() { return {SONICMOE_HAS_SM90 != 0, SONICMOE_HAS_SM100 != 0}; }

int device_arch(int device) {
  int major = 0, minor = 0;
  if (!compute_capability(device, &major, &minor).empty()) return 0;
  return arch_family(major, minor);
}

KernelArchChoice choose_kernel_arch(const char* op, int major, int minor, BuiltArchs built) {
  const std::string prefix = std::string(op) + ": ";
  switch (arch_family(major, minor)) {
    case 90:
      if (built.sm90) return {KernelArch::kSm90, {}};
      return {KernelArch::kNone, prefix + gpu_text(major, minor) + " but this build holds " + built_text(built) +
                                     ": rebuild with SONICMOE_CUDA_ARCHS=\"90a\" or \"90a;100a\""};
    case 100:
      if (built.sm100) return {KernelArch::kSm100, {}};
      return {KernelArch::kNone, prefix + gpu_text(major, minor) + " but this build holds " + built_text(built) +
                                     ": rebuild with SONICMOE_CUDA_ARCHS=\"90a;100a\""};
    default: break;
  }
  if (major == 10) {  // 10.3 (B300, GB300) and any other 10.x: not binary-compatible with sm_100a
    return {KernelArch::kNone,
            prefix + gpu_text(major, minor) + ": the Blackwell kernels are sm_100a, which load on compute capability "
                     "10.0 only (B200, GB200); an arch-specific 'a' target runs on no other GPU, and no " +
                sm_name(major, minor) + "a kernels are built"};
  }
  return {KernelArch::kNone, prefix + gpu_text(major, minor) +
                                 ": the kernels run on Hopper sm_90 (H100, H200) and Blackwell sm_100 (B200, GB200); "
                                 "this build holds " + built_text(built)};
}

KernelArchChoice device_kernel_arch(const char* op, int device) {
  int major = 0, minor = 0;
  const std::string error = compute_capability(device, &major, &minor);
  if (!error.empty())
    return {KernelArch::kNone, std::string(op) + ": cannot read the compute capability of CUDA device " +
                                   std::to_string(device) + ": " + error};
  return choose_kernel_arch(op, major, minor, built_archs());
}

}  // namespace sonicmoe
