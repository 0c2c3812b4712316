// Argument checks of the torch layer: every failure names the argument, its value and the rule.
//
// Values are turned into text with std::to_string / c10's own printers, never by streaming a
// number inside this library: a toolchain that links its own libstdc++ into the extension (seen
// on the H200 image) crashes in the number formatting of a second libstdc++ copy.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#include <climits>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

namespace sonicmoe::torch_ops {

inline std::string text(int64_t v) { return std::to_string(v); }
inline std::string text(const std::string& v) { return v; }

inline std::string list_text(c10::IntArrayRef values) {
  std::string s = "[";
  for (size_t i = 0; i < values.size(); ++i) s += (i ? ", " : "") + std::to_string(values[i]);
  return s + "]";
}

[[noreturn]] inline void fail_arg(const char* op, const std::string& name, const std::string& value,
                                  const std::string& rule) {
  TORCH_CHECK_VALUE(false, std::string(op) + ": " + name + " = " + value +
                               " breaks the rule: " + rule);
}

inline void check_arg(bool ok, const char* op, const std::string& name, const std::string& value,
                      const std::string& rule) {
  if (!ok) fail_arg(op, name, value, rule);
}

// A scalar argument the kernels take as int. A value outside int32 is named as given: clamped
// into range, the op's own rule would report a value the caller never passed.
inline int int32_arg(const char* op, const char* name, int64_t value) {
  check_arg(value >= INT32_MIN && value <= INT32_MAX, op, name, text(value), "must fit in int32");
  return static_cast<int>(value);
}

inline void check_dtype(const char* op, const at::Tensor& t, const char* name,
                        at::ScalarType expected) {
  if (t.scalar_type() != expected) {
    TORCH_CHECK_TYPE(false, std::string(op) + ": " + name + ".dtype = " +
                                c10::toString(t.scalar_type()) + " breaks the rule: must be " +
                                c10::toString(expected));
  }
}

inline void check_dim(const char* op, const at::Tensor& t, const char* name, int64_t dim,
                      const char* layout) {
  check_arg(t.dim() == dim, op, std::string(name) + ".shape", list_text(t.sizes()),
            "must be " + std::to_string(dim) + "-D " + layout);
}

inline void check_contiguous(const char* op, const at::Tensor& t, const char* name) {
  check_arg(t.is_contiguous(), op, std::string(name) + ".stride()", list_text(t.strides()),
            "must be contiguous (row-major); call .contiguous() first");
}

// A tile_config argument as a GemmTileConfig (the op's own rules then say which it runs).
inline GemmTileConfig tile_config_arg(const char* op, int64_t tile_config) {
  check_arg(tile_config >= 0 && tile_config < kNumGemmTileConfigs, op, "tile_config", text(tile_config),
            "must be 0 (auto) or a GemmTileConfig in [1, " + std::to_string(kNumGemmTileConfigs - 1) + "]");
  return static_cast<GemmTileConfig>(tile_config);
}

inline GluActivation activation_arg(const char* op, int64_t activation) {
  check_arg(activation >= 0 && activation < kNumGluActivations, op, "activation", text(activation),
            "must be a GluActivation: 0 (SwiGLU), 1 (GeGLU) or 2 (ReGLU)");
  return static_cast<GluActivation>(activation);
}

inline void check_aligned16(const char* op, const at::Tensor& t, const char* name) {
  const auto addr = reinterpret_cast<uintptr_t>(t.data_ptr());
  check_arg(t.numel() == 0 || addr % 16 == 0, op, std::string(name) + ".data_ptr()",
            std::to_string(addr), "must be 16-byte aligned (TMA); a sliced view may not be");
}

// The device must be one this build has kernels for: sm_90 (H100, H200) where the library holds
// sm_90a kernels, sm_100 (B200, GB200) where it holds sm_100a ones. An 'a' cubin loads on its exact
// compute capability only. The message (device_kernel_arch) names the GPU, the build and the fix.
inline void check_kernel_device(const char* op, const at::Tensor& t, const std::string& name) {
  const KernelArchChoice choice = device_kernel_arch(op, t.get_device());
  if (choice.arch == KernelArch::kNone)
    TORCH_CHECK_VALUE(false, choice.error + " (" + name + ".device = " + t.device().str() + ")");
}

// Every tensor on the CUDA device of the first one, a GPU this build runs op on (after all other
// checks, so CPU tests reach those first).
inline void check_same_cuda_device(
    const char* op, std::initializer_list<std::pair<const at::Tensor*, const char*>> tensors) {
  const at::Tensor& first = *tensors.begin()->first;
  const std::string first_name = tensors.begin()->second;
  for (const auto& [t, name] : tensors) {
    check_arg(t->is_cuda(), op, std::string(name) + ".device", t->device().str(),
              "must be a CUDA device (the kernels are CUDA-only)");
    check_arg(t->device() == first.device(), op, std::string(name) + ".device",
              t->device().str(), "must be the device of " + first_name + " (" +
                                     first.device().str() + ")");
  }
  check_kernel_device(op, first, first_name);
}

// On an sm_100 GPU (t's device) the op's sm100 rules (tile_config auto only) raise as argument
// errors, before anything is allocated or launched; the host library checks them again at launch.
template <class Params>
void check_sm100_rules(const at::Tensor& t, const Params& params, std::string (*rules)(const Params&)) {
  if (device_arch(t.get_device()) != 100) return;
  const std::string problem = rules(params);
  TORCH_CHECK_VALUE(problem.empty(), problem);
}

// The SM count of t's device (check_same_cuda_device has checked it).
inline int device_sm_count(const at::Tensor& t) {
  int sm_count = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, t.get_device()));
  return sm_count;
}

}  // namespace sonicmoe::torch_ops
