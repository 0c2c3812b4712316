// Helpers shared by the GoogleTest files: bf16 conversion on the host, GPU presence.
#pragma once

#include <cuda_runtime_api.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "sonicmoe.h"

namespace sonicmoe::test {

inline bool hopper_available() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) return false;
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  return major == 9;
}

// A Blackwell B200 / GB200 (compute capability 10.0, the one sm_100a loads on) as device 0.
inline bool blackwell_available() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) return false;
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  return major == 10 && minor == 0;
}

inline uint16_t to_bf16(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

inline float from_bf16(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// A valid expert-MLP problem (paper-7b-n256 at T = 4096) for the host-rule tests of K1 and K4.
template <class Params>
Params expert_mlp_shape() {
  Params p;
  p.num_tokens = 4096;
  p.m_total = 4096 * 8;
  p.d = 1536;
  p.n = 256;
  p.num_experts = 128;
  p.sm_count = 132;
  return p;
}

// A valid weight-gradient problem: dW1 of paper-7b-n256 at T = 24576, dH (M, 2n)^T x (T, d).
inline WeightGradParams weight_grad_shape() {
  WeightGradParams p;
  p.num_tokens = 24576;
  p.m_total = 24576 * 8;
  p.m_out = 512;
  p.n_out = 1536;
  p.num_experts = 128;
  p.gather_a = false;
  p.sm_count = 132;
  return p;
}

// (d, n, E) of the anchor configs (benchmarks/anchors).
struct AnchorShape {
  int64_t d, n;
  int num_experts;
};
inline constexpr AnchorShape kAnchorShapes[] = {{1536, 256, 128},  {1536, 1024, 32}, {4096, 512, 128},
                                                {4096, 1024, 128}, {2048, 1024, 64}, {2048, 768, 128},
                                                {4096, 1536, 128}, {7168, 2048, 256}};

// A host rule check against a list of (mutation of a valid shape, expected message part).
template <class Params>
struct RejectionCase {
  void (*mutate)(Params&);
  const char* expected;
};

template <class Params, size_t N>
void expect_rejections(const Params& valid, const RejectionCase<Params> (&cases)[N],
                       std::string (*check)(const Params&)) {
  EXPECT_EQ(check(valid), "");
  for (const auto& c : cases) {
    Params p = valid;
    c.mutate(p);
    const std::string msg = check(p);
    EXPECT_NE(msg.find(c.expected), std::string::npos) << "got: " << msg;
  }
}

}  // namespace sonicmoe::test

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr
