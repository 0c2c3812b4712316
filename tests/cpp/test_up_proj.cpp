// GoogleTest of the up-projection (K1): host rules (runs anywhere) and the sm90 kernel against a
// CPU loop of gather + GEMM + SwiGLU (needs a Hopper GPU; skips elsewhere).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/h_column_order.h"
#include "common/tile_size.h"
#include "sm90/heuristics.h"
#include "sonicmoe.h"
#include "test_util.h"

namespace {

using sonicmoe::GemmTileConfig;
using sonicmoe::UpProjParams;
using sonicmoe::test::from_bf16;
using sonicmoe::test::hopper_available;
using sonicmoe::test::to_bf16;

UpProjParams valid_shape() { return sonicmoe::test::expert_mlp_shape<UpProjParams>(); }

// ---------------------------------------------------------------- host logic, no GPU needed

TEST(UpProjHost, accepts_anchor_shapes) {
  for (const auto& s : sonicmoe::test::kAnchorShapes) {
    UpProjParams p = valid_shape();
    p.d = s.d;
    p.n = s.n;
    p.num_experts = s.num_experts;
    EXPECT_EQ(sonicmoe::check_up_proj(p), "") << "d=" << p.d << " n=" << p.n;
  }
}

TEST(UpProjHost, rejects_bad_shapes_naming_argument_value_rule) {
  const sonicmoe::test::RejectionCase<UpProjParams> cases[] = {
      {[](UpProjParams& p) { p.num_experts = 0; }, "up_proj: num_experts = 0 breaks the rule: must be >= 1"},
      {[](UpProjParams& p) { p.num_tokens = -1; }, "num_tokens = -1 breaks the rule"},
      {[](UpProjParams& p) { p.m_total = int64_t(1) << 31; }, "m_total = 2147483648 breaks"},
      {[](UpProjParams& p) { p.d = 100; }, "d = 100 breaks the rule: must be a positive multiple of 8"},
      {[](UpProjParams& p) { p.n = 0; }, "n = 0 breaks the rule"},
      {[](UpProjParams& p) { p.n = 250; }, "n = 250 breaks the rule"},
      {[](UpProjParams& p) { p.sm_count = 0; }, "sm_count = 0 breaks the rule"},
      {[](UpProjParams& p) { p.config = GemmTileConfig::kCooperative128x256x64; },
       "up_proj: config = 3 breaks the rule: must be 0 (auto) or a varlen configuration"},
      {[](UpProjParams& p) { p.m_total = INT32_MAX; p.n = 1 << 20; }, "tiles must fit in int32"},
      {[](UpProjParams& p) { p.activation = static_cast<sonicmoe::GluActivation>(3); },
       "up_proj: activation = 3 breaks the rule: must name a GluActivation"},
  };
  sonicmoe::test::expect_rejections(valid_shape(), cases, &sonicmoe::check_up_proj);
}

TEST(UpProjHost, run_rejects_null_and_misaligned_pointers_before_any_launch) {
  UpProjParams p = valid_shape();
  EXPECT_NE(sonicmoe::run_up_proj(p).message.find("must be non-null"), std::string::npos);
  alignas(16) static char buf[64];
  p.x = buf + 2;
  p.w1 = p.a = buf;
  p.expert_offsets = p.gather_idx = reinterpret_cast<const int32_t*>(buf);
  EXPECT_NE(sonicmoe::run_up_proj(p).message.find("16-byte aligned"), std::string::npos);
}

TEST(UpProjHost, empty_problem_launches_nothing) {
  UpProjParams p = valid_shape();
  p.m_total = 0;
  EXPECT_TRUE(sonicmoe::run_up_proj(p).ok());
}

TEST(UpProjHost, tile_bound_covers_any_routing) {
  // Each expert adds at most one partial m block to the full ones.
  EXPECT_EQ(sonicmoe::varlen_max_tiles(0, 4, 128, 3), 12);
  EXPECT_EQ(sonicmoe::varlen_max_tiles(129, 1, 128, 2), 6);
  EXPECT_EQ(sonicmoe::varlen_max_tiles(1000, 8, 128, 1), 16);
}

TEST(UpProjHost, heuristic_takes_the_wide_tile_clustered_where_d_is_long) {
  using sonicmoe::sm90::choose_up_proj_config;
  EXPECT_EQ(choose_up_proj_config(1536, 4096), GemmTileConfig::kVarlenCooperative128x256x64C2x1);  // qwen3-235b
  EXPECT_EQ(choose_up_proj_config(2048, 7168), GemmTileConfig::kVarlenCooperative128x256x64C2x1);  // deepseek-v3
  EXPECT_EQ(choose_up_proj_config(1024, 2048), GemmTileConfig::kVarlenCooperative128x256x64);      // olmoe-1b-7b
  EXPECT_EQ(choose_up_proj_config(256, 1536), GemmTileConfig::kVarlenCooperative128x256x64);       // paper-7b-n256
  EXPECT_EQ(choose_up_proj_config(384 + 64, 4096), GemmTileConfig::kVarlenPingpong128x128x64);     // n not in 128s
}

// ---------------------------------------------------------------- GPU: kernel vs CPU loop

struct UpProjCase {
  std::vector<int> rows_per_expert;
  int num_tokens, d, n;
  bool keep_h;
};

// act(g) in double, as common/glu_math.cuh computes it in fp32 (GeGLU: GELU's tanh form).
double reference_act(sonicmoe::GluActivation act, double g) {
  switch (act) {
    case sonicmoe::GluActivation::kGeGLU:
      return 0.5 * g * (1.0 + std::tanh(0.7978845608028654 * (g + 0.044715 * g * g * g)));
    case sonicmoe::GluActivation::kReGLU: return g > 0.0 ? g : 0.0;
    default: return g / (1.0 + std::exp(-g));
  }
}

void run_case(const UpProjCase& c, uint32_t seed, GemmTileConfig config,
              sonicmoe::GluActivation activation = sonicmoe::GluActivation::kSwiGLU) {
  const int experts = static_cast<int>(c.rows_per_expert.size());
  std::vector<int32_t> offsets(experts + 1, 0);
  for (int e = 0; e < experts; ++e) offsets[e + 1] = offsets[e] + c.rows_per_expert[e];
  const int64_t m = offsets[experts];

  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_int_distribution<int> token(0, c.num_tokens - 1);
  std::vector<uint16_t> x(int64_t(c.num_tokens) * c.d), w1(int64_t(experts) * 2 * c.n * c.d);
  std::vector<int32_t> gather(m);
  for (auto& v : x) v = to_bf16(normal(rng));
  for (auto& v : w1) v = to_bf16(normal(rng) / std::sqrt(float(c.d)));
  for (auto& g : gather) g = token(rng);

  int sm_count = 0;
  CUDA_OK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0));
  void *d_x, *d_w1, *d_h, *d_a;
  int32_t *d_off, *d_gather;
  const size_t h_bytes = std::max<size_t>(m * 2 * c.n * 2, 16), a_bytes = std::max<size_t>(m * c.n * 2, 16);
  CUDA_OK(cudaMalloc(&d_x, x.size() * 2));
  CUDA_OK(cudaMalloc(&d_w1, w1.size() * 2));
  CUDA_OK(cudaMalloc(&d_h, h_bytes));
  CUDA_OK(cudaMalloc(&d_a, a_bytes));
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&d_off), offsets.size() * 4));
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&d_gather), std::max<size_t>(gather.size() * 4, 4)));
  CUDA_OK(cudaMemcpy(d_x, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d_w1, w1.data(), w1.size() * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d_off, offsets.data(), offsets.size() * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d_gather, gather.data(), gather.size() * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(d_h, 0xff, h_bytes));  // poison: bf16 0xffff is NaN
  CUDA_OK(cudaMemset(d_a, 0xff, a_bytes));

  UpProjParams p;
  p.x = d_x;
  p.w1 = d_w1;
  p.expert_offsets = d_off;
  p.gather_idx = d_gather;
  p.h = c.keep_h ? d_h : nullptr;
  p.a = d_a;
  p.num_tokens = c.num_tokens;
  p.m_total = m;
  p.d = c.d;
  p.n = c.n;
  p.num_experts = experts;
  p.sm_count = sm_count;
  p.config = config;
  p.activation = activation;
  const sonicmoe::Status st = sonicmoe::run_up_proj(p);
  ASSERT_TRUE(st.ok()) << st.message;
  CUDA_OK(cudaDeviceSynchronize());

  std::vector<uint16_t> h(m * 2 * c.n), a(m * c.n);
  CUDA_OK(cudaMemcpy(h.data(), d_h, h.size() * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(a.data(), d_a, a.size() * 2, cudaMemcpyDeviceToHost));
  double h_err2 = 0, h_ref2 = 0, a_err2 = 0, a_ref2 = 0;
  std::vector<double> row(2 * c.n);
  for (int e = 0; e < experts; ++e) {
    for (int r = offsets[e]; r < offsets[e + 1]; ++r) {
      const uint16_t* xr = &x[int64_t(gather[r]) * c.d];
      for (int j = 0; j < 2 * c.n; ++j) {
        const uint16_t* wr = &w1[(int64_t(e) * 2 * c.n + j) * c.d];
        double acc = 0;
        for (int kk = 0; kk < c.d; ++kk) acc += double(from_bf16(xr[kk])) * from_bf16(wr[kk]);
        row[j] = acc;
      }
      for (int j = 0; j < c.n; ++j) {
        const double act = reference_act(activation, row[j]) * row[c.n + j];
        const float got = from_bf16(a[int64_t(r) * c.n + j]);
        ASSERT_TRUE(std::isfinite(got)) << "unwritten or non-finite a at row " << r << " col " << j;
        a_err2 += (got - act) * (got - act);
        a_ref2 += act * act;
      }
      for (int j = 0; j < 2 * c.n && c.keep_h; ++j) {  // H in its column order (common/h_column_order.h)
        const int64_t pos = j < c.n ? sonicmoe::h_position(j, c.n) : c.n + sonicmoe::h_position(j - c.n, c.n);
        const float got = from_bf16(h[int64_t(r) * 2 * c.n + pos]);
        ASSERT_TRUE(std::isfinite(got)) << "unwritten or non-finite h at row " << r << " col " << j;
        h_err2 += (got - row[j]) * (got - row[j]);
        h_ref2 += row[j] * row[j];
      }
    }
  }
  if (m > 0) EXPECT_LE(std::sqrt(a_err2 / a_ref2), 1e-2);
  if (m > 0 && c.keep_h) EXPECT_LE(std::sqrt(h_err2 / h_ref2), 1e-2);
  cudaFree(d_x);
  cudaFree(d_w1);
  cudaFree(d_h);
  cudaFree(d_a);
  cudaFree(d_off);
  cudaFree(d_gather);
}

// Parameter: the varlen configuration (ping-pong 128 x 128, cooperative 128 x 256 or 256 x 128).
class SM90_UpProj : public ::testing::TestWithParam<GemmTileConfig> {
 protected:
  void SetUp() override {
    if (!hopper_available()) GTEST_SKIP() << "needs a Hopper (sm_90) GPU";
  }
};

TEST_P(SM90_UpProj, bf16_ragged_experts_with_empty_ones) {
  run_case({{0, 37, 128, 0, 1, 300, 0, 65}, 200, 256, 192, true}, 1, GetParam());
}

TEST_P(SM90_UpProj, bf16_one_expert_holds_all_rows_without_h) {
  run_case({{0, 0, 777, 0}, 300, 512, 128, false}, 2, GetParam());
}

TEST_P(SM90_UpProj, bf16_d_and_n_not_multiples_of_the_tile) {
  run_case({{150, 90}, 64, 72, 40, true}, 3, GetParam());
}

TEST_P(SM90_UpProj, bf16_many_tiles_per_cta_and_deep_k) {
  // More tiles than SMs with k loops longer than the stage ring: the ping-pong turn order.
  std::vector<int> rows(64);
  std::mt19937 rng(4);
  for (auto& r : rows) r = static_cast<int>(rng() % 300);
  run_case({rows, 500, 1024, 128, true}, 4, GetParam());
}

TEST_P(SM90_UpProj, bf16_geglu_and_reglu) {
  for (auto act : {sonicmoe::GluActivation::kGeGLU, sonicmoe::GluActivation::kReGLU})
    run_case({{0, 37, 128, 0, 1, 300, 0, 65}, 200, 256, 192, true}, 5, GetParam(), act);
}

INSTANTIATE_TEST_SUITE_P(Configs, SM90_UpProj,
                         ::testing::Values(GemmTileConfig::kVarlenPingpong128x128x64,
                                           GemmTileConfig::kVarlenCooperative128x256x64,
                                           GemmTileConfig::kVarlenCooperative256x128x64,
                                           GemmTileConfig::kVarlenCooperative128x256x64C2x1,
                                           GemmTileConfig::kVarlenPingpong128x128x64C2x1),
                         [](const ::testing::TestParamInfo<GemmTileConfig>& info) {
                           return std::string(sonicmoe::gemm_tile_config_name(info.param));
                         });

}  // namespace
