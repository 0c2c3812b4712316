// GoogleTest: combine (K3) host rules, and the kernel against a CPU loop on a Hopper GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "sonicmoe.h"
#include "test_util.h"

namespace {

using sonicmoe::CombineParams;
using sonicmoe::test::from_bf16;
using sonicmoe::test::to_bf16;

CombineParams valid_combine() {
  CombineParams p;
  p.num_tokens = 100;
  p.top_k = 8;
  p.d = 2048;
  p.num_rows = 800;
  return p;
}

TEST(CombineHost, rejects_bad_shapes_naming_argument_value_rule) {
  EXPECT_EQ(sonicmoe::check_combine(valid_combine()), "");
  auto msg = [](void (*mutate)(CombineParams&)) {
    CombineParams p = valid_combine();
    mutate(p);
    return sonicmoe::check_combine(p);
  };
  EXPECT_NE(msg([](CombineParams& p) { p.top_k = 0; }).find("top_k = 0 breaks the rule"), std::string::npos);
  EXPECT_NE(msg([](CombineParams& p) { p.top_k = 33; }).find("top_k = 33 breaks"), std::string::npos);
  EXPECT_NE(msg([](CombineParams& p) { p.d = 100; }).find("d = 100 breaks the rule: must be a positive multiple of 8"),
            std::string::npos);
  EXPECT_NE(msg([](CombineParams& p) { p.num_tokens = -1; }).find("num_tokens = -1 breaks"), std::string::npos);
}

TEST(CombineHost, empty_launches_nothing_and_null_pointers_are_refused) {
  CombineParams p = valid_combine();
  EXPECT_NE(sonicmoe::run_combine(p).message.find("must be non-null"), std::string::npos);
  p.num_tokens = 0;
  EXPECT_TRUE(sonicmoe::run_combine(p).ok());
}

TEST(CombineDxHost, shares_combines_rules_under_its_own_name) {
  sonicmoe::CombineDxParams p;
  p.num_tokens = 100;
  p.top_k = 8;
  p.d = 2048;
  p.num_rows = 800;
  EXPECT_EQ(sonicmoe::check_combine_dx(p), "");
  EXPECT_NE(sonicmoe::run_combine_dx(p).message.find("combine_dx: dx_rows, rev_idx and out must be non-null"),
            std::string::npos);
  p.d = 100;
  EXPECT_NE(sonicmoe::check_combine_dx(p).find("combine_dx: d = 100 breaks the rule: must be a positive multiple of 8"),
            std::string::npos);
  p.d = 2048;
  p.top_k = 33;
  EXPECT_NE(sonicmoe::check_combine_dx(p).find("combine_dx: top_k = 33 breaks"), std::string::npos);
  p.top_k = 8;
  p.num_tokens = 0;
  EXPECT_TRUE(sonicmoe::run_combine_dx(p).ok());  // nothing to launch, no pointer needed
}

TEST(SM90_Combine, bf16_matches_cpu_loop) {
  if (!sonicmoe::test::hopper_available()) GTEST_SKIP() << "needs a Hopper (sm_90) GPU";
  const int T = 300, K = 6, d = 264;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<uint16_t> y(size_t(T) * K * d);
  for (auto& v : y) v = to_bf16(normal(rng));
  std::vector<float> scores(size_t(T) * K);
  for (auto& s : scores) s = std::abs(normal(rng));
  std::vector<int32_t> rev(size_t(T) * K);
  std::iota(rev.begin(), rev.end(), 0);
  std::shuffle(rev.begin(), rev.end(), rng);

  void *d_y, *d_out;
  float* d_scores;
  int32_t* d_rev;
  CUDA_OK(cudaMalloc(&d_y, y.size() * 2));
  CUDA_OK(cudaMalloc(&d_out, size_t(T) * d * 2));
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&d_scores), scores.size() * 4));
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&d_rev), rev.size() * 4));
  CUDA_OK(cudaMemcpy(d_y, y.data(), y.size() * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d_scores, scores.data(), scores.size() * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d_rev, rev.data(), rev.size() * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(d_out, 0xff, size_t(T) * d * 2));  // poison: NaN

  CombineParams p;
  p.y = d_y;
  p.scores = d_scores;
  p.rev_idx = d_rev;
  p.out = d_out;
  p.num_tokens = T;
  p.top_k = K;
  p.d = d;
  p.num_rows = int64_t(T) * K;
  const sonicmoe::Status st = sonicmoe::run_combine(p);
  ASSERT_TRUE(st.ok()) << st.message;
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint16_t> out(size_t(T) * d);
  CUDA_OK(cudaMemcpy(out.data(), d_out, out.size() * 2, cudaMemcpyDeviceToHost));

  double err2 = 0, ref2 = 0;
  for (int t = 0; t < T; ++t) {
    for (int j = 0; j < d; ++j) {
      double ref = 0;
      for (int k = 0; k < K; ++k)
        ref += double(scores[t * K + k]) * from_bf16(y[size_t(rev[t * K + k]) * d + j]);
      const float got = from_bf16(out[size_t(t) * d + j]);
      ASSERT_TRUE(std::isfinite(got)) << "unwritten output at token " << t << " col " << j;
      err2 += (got - ref) * (got - ref);
      ref2 += ref * ref;
    }
  }
  EXPECT_LE(std::sqrt(err2 / ref2), 1e-2);
  cudaFree(d_y);
  cudaFree(d_out);
  cudaFree(d_scores);
  cudaFree(d_rev);
}

}  // namespace
