// GoogleTest suite of the kernel library: host logic (runs anywhere) and the sm90 grouped GEMM
// against a CPU loop (needs a Hopper GPU; skips elsewhere), the sm100 one likewise on a B200.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/grouped_gemm_workspace.h"
#include "common/tile_size.h"
#include "sm90/heuristics.h"
#include "sm100/grouped_gemm_sm100.h"
#include "sonicmoe.h"
#include "test_util.h"

namespace {

using sonicmoe::GemmTileConfig;
using sonicmoe::GroupedGemmParams;
using sonicmoe::test::from_bf16;
using sonicmoe::test::hopper_available;
using sonicmoe::test::to_bf16;

GroupedGemmParams valid_shape() {
  GroupedGemmParams p;
  p.m_total = 1000;
  p.k = 256;
  p.n_out = 1536;
  p.num_experts = 8;
  p.sm_count = 132;
  return p;
}

// ---------------------------------------------------------------- host logic, no GPU needed

TEST(GroupedGemmHost, accepts_anchor_shapes) {
  for (const auto& s : sonicmoe::test::kAnchorShapes) {  // down-projection: k = n, n_out = d
    GroupedGemmParams p = valid_shape();
    p.k = s.n;
    p.n_out = s.d;
    p.num_experts = s.num_experts;
    EXPECT_EQ(sonicmoe::check_grouped_gemm(p), "") << "k=" << p.k << " n_out=" << p.n_out;
  }
}

TEST(GroupedGemmHost, rejects_bad_shapes_naming_argument_value_rule) {
  const sonicmoe::test::RejectionCase<GroupedGemmParams> cases[] = {
      {[](GroupedGemmParams& p) { p.num_experts = 0; }, "num_experts = 0 breaks the rule: must be >= 1"},
      {[](GroupedGemmParams& p) { p.m_total = -1; }, "m_total = -1 breaks the rule"},
      {[](GroupedGemmParams& p) { p.m_total = int64_t(1) << 31; }, "m_total = 2147483648 breaks"},
      {[](GroupedGemmParams& p) { p.k = 100; }, "k = 100 breaks the rule: must be a positive multiple of 8"},
      {[](GroupedGemmParams& p) { p.k = 0; }, "k = 0 breaks the rule"},
      {[](GroupedGemmParams& p) { p.n_out = 1530; }, "n_out = 1530 breaks the rule"},
      {[](GroupedGemmParams& p) { p.sm_count = 0; }, "sm_count = 0 breaks the rule"},
      {[](GroupedGemmParams& p) { p.config = static_cast<GemmTileConfig>(13); }, "config = 13 breaks"},
      {[](GroupedGemmParams& p) { p.partial_rows = true; p.config = GemmTileConfig::kPingpong128x128x64; },
       "config = 1 breaks the rule: partial_rows runs on the varlen kernels only: use 0 (auto) or 7 to 12"},
      {[](GroupedGemmParams& p) { p.b_layout = sonicmoe::WeightLayout::kKN; p.config = GemmTileConfig::kPingpong128x128x64; },
       "config = 1 breaks the rule: b_layout KN (b is (E, k, n_out)) runs on the varlen kernels only: use 0 (auto) or 7 to 12"},
  };
  sonicmoe::test::expect_rejections(valid_shape(), cases, &sonicmoe::check_grouped_gemm);
}

// grouped_gemm's own ping-pong 128 x 192 tile runs K2 and K6 (b_layout KN, with or without the
// addend), on whole or partial rows.
TEST(GroupedGemmHost, accepts_its_own_varlen_tile_in_both_layouts) {
  for (const auto layout : {sonicmoe::WeightLayout::kNK, sonicmoe::WeightLayout::kKN})
    for (const bool partial_rows : {false, true}) {
      GroupedGemmParams p = valid_shape();
      p.b_layout = layout;
      p.partial_rows = partial_rows;
      p.config = GemmTileConfig::kVarlenPingpong128x192x64;
      EXPECT_EQ(sonicmoe::check_grouped_gemm(p), "") << "b_layout " << int(layout) << " partial_rows " << partial_rows;
    }
}

TEST(GroupedGemmHost, run_rejects_null_and_misaligned_pointers_before_any_launch) {
  GroupedGemmParams p = valid_shape();
  EXPECT_NE(sonicmoe::run_grouped_gemm(p).message.find("must be non-null"), std::string::npos);
  alignas(16) static char buf[64];
  p.a = buf + 2;
  p.b = p.out = p.workspace = buf;
  p.expert_offsets = reinterpret_cast<const int32_t*>(buf);
  EXPECT_NE(sonicmoe::run_grouped_gemm(p).message.find("16-byte aligned"), std::string::npos);
}

TEST(GroupedGemmHost, run_rejects_a_bad_addend_before_any_launch) {
  GroupedGemmParams p = valid_shape();
  alignas(16) static char buf[64];
  p.a = p.b = p.out = p.workspace = buf;
  p.expert_offsets = reinterpret_cast<const int32_t*>(buf);
  p.addend_scale = reinterpret_cast<const float*>(buf);
  auto message = [&p] { return sonicmoe::run_grouped_gemm(p).message; };
  EXPECT_NE(message().find("addend_scale / addend_rows run with b_layout KN (K6) only"), std::string::npos);
  p.b_layout = sonicmoe::WeightLayout::kKN;
  EXPECT_NE(message().find("addend_scale and addend_rows come together (both or neither)"), std::string::npos);
  p.addend_rows = buf + 2;
  EXPECT_NE(message().find("addend_rows must be 16-byte aligned"), std::string::npos);
  p.addend_rows = buf;
  p.addend_scale = reinterpret_cast<const float*>(buf + 2);
  EXPECT_NE(message().find("addend_scale must be 4-byte aligned"), std::string::npos);
}

TEST(GroupedGemmHost, empty_problem_launches_nothing) {
  GroupedGemmParams p = valid_shape();
  p.m_total = 0;  // no pointers needed: nothing is read or written
  EXPECT_TRUE(sonicmoe::run_grouped_gemm(p).ok());
}

TEST(GroupedGemmHost, workspace_layout_sections_are_aligned_and_disjoint) {
  for (int experts : {1, 7, 8, 128, 256, 1000}) {
    const auto l = sonicmoe::grouped_gemm_workspace_layout(experts, 12345);
    const size_t starts[] = {l.problem_shapes, l.ptr_a,      l.ptr_b,            l.ptr_out,           l.stride_a,
                             l.stride_b,       l.stride_out, l.ptr_addend_scale, l.ptr_addend_rows, l.cutlass};
    const size_t sizes[] = {experts * sonicmoe::kProblemShapeSlotBytes,
                            experts * sonicmoe::kPointerSlotBytes,
                            experts * sonicmoe::kPointerSlotBytes,
                            experts * sonicmoe::kPointerSlotBytes,
                            experts * sonicmoe::kStrideSlotBytes,
                            experts * sonicmoe::kStrideSlotBytes,
                            experts * sonicmoe::kStrideSlotBytes,
                            experts * sonicmoe::kPointerSlotBytes,
                            experts * sonicmoe::kPointerSlotBytes,
                            12345};
    constexpr int kSections = sizeof(starts) / sizeof(starts[0]);
    for (int i = 0; i < kSections; ++i) {
      EXPECT_EQ(starts[i] % sonicmoe::kWorkspaceAlignment, 0u);
      const size_t end = starts[i] + sizes[i];
      EXPECT_LE(end, i + 1 < kSections ? starts[i + 1] : l.total) << "section " << i << " overlaps";
    }
    EXPECT_EQ(l.total % sonicmoe::kWorkspaceAlignment, 0u);
  }
}

TEST(GroupedGemmHost, workspace_size_covers_arguments_and_grows_with_experts) {
  const size_t w8 = sonicmoe::grouped_gemm_workspace_size(8, 132);
  const size_t w256 = sonicmoe::grouped_gemm_workspace_size(256, 132);
  EXPECT_GE(w8, sonicmoe::grouped_gemm_workspace_layout(8, 0).total);
  EXPECT_GT(w256, w8);
  // Per-SM tensormaps live in CUTLASS's part: more SMs need more workspace.
  EXPECT_GE(sonicmoe::grouped_gemm_workspace_size(8, 264), w8);
}

TEST(GroupedGemmHost, heuristic_picks_a_concrete_config) {
  for (int64_t m : {1, 64, 1000, 262144}) {
    for (int experts : {1, 8, 128, 256}) {
      const GemmTileConfig c = sonicmoe::choose_grouped_gemm_config(m, 4096, 1024, experts);
      EXPECT_NE(c, GemmTileConfig::kAuto);
      EXPECT_GT(sonicmoe::gemm_tile_shape(c).m, 0);
    }
  }
}

TEST(GroupedGemmHost, heuristic_takes_the_wide_varlen_tile_for_few_rows_into_a_wide_output) {
  using sonicmoe::sm90::choose_grouped_gemm_config;
  constexpr auto kWide = GemmTileConfig::kVarlenCooperative128x256x64;
  constexpr auto kVarlenPingpong = GemmTileConfig::kVarlenPingpong128x128x64;
  EXPECT_EQ(choose_grouped_gemm_config(131072, 7168, 2048, 256), kWide);            // deepseek-v3: 512 rows
  EXPECT_EQ(choose_grouped_gemm_config(131072, 2048, 2048, 256), kVarlenPingpong);  // narrow output
  EXPECT_EQ(choose_grouped_gemm_config(131072, 7176, 2048, 256), kVarlenPingpong);  // not in 256s
  EXPECT_EQ(choose_grouped_gemm_config(196608, 1536, 256, 128), kVarlenPingpong);   // paper-7b-n256: k 256
  EXPECT_EQ(choose_grouped_gemm_config(262144, 4096, 1536, 128), GemmTileConfig::kPingpong128x128x64);  // qwen3-235b
  EXPECT_EQ(choose_grouped_gemm_config(4096, 4096, 1024, 128), GemmTileConfig::kPingpong64x128x128);    // 32 rows
}

TEST(GroupedGemmHost, kn_heuristic_takes_the_wide_tile_only_where_it_measured_faster) {
  using sonicmoe::sm90::choose_grouped_gemm_kn_config;
  constexpr auto kWide = GemmTileConfig::kVarlenCooperative128x256x64;
  constexpr auto kPingpong = GemmTileConfig::kVarlenPingpong128x128x64;
  constexpr auto kClustered = GemmTileConfig::kVarlenCooperative128x256x64C2x1;
  EXPECT_EQ(choose_grouped_gemm_kn_config(262144, 4096, 3072, 128), kClustered);  // qwen3-235b: k 3072
  EXPECT_EQ(choose_grouped_gemm_kn_config(131072, 7168, 4096, 256), kClustered);  // deepseek-v3: 512 rows, k 4096
  EXPECT_EQ(choose_grouped_gemm_kn_config(262144, 4096, 2048, 128), kWide);       // paper-120b: k 2048
  EXPECT_EQ(choose_grouped_gemm_kn_config(262144, 4096, 1024, 128), kWide);       // paper-30b: k 1024
  EXPECT_EQ(choose_grouped_gemm_kn_config(262144, 2048, 2048, 64), kWide);        // olmoe-1b-7b
  EXPECT_EQ(choose_grouped_gemm_kn_config(262144, 2048, 1536, 128), kPingpong);   // qwen3-30b-a3b
  EXPECT_EQ(choose_grouped_gemm_kn_config(131072, 7168, 2048, 256), kPingpong);   // 512 rows, short k
  EXPECT_EQ(choose_grouped_gemm_kn_config(32768, 7168, 4096, 256), kPingpong);    // 128 rows
  EXPECT_EQ(choose_grouped_gemm_kn_config(196608, 1536, 512, 128), kPingpong);    // paper-7b: d 1536
  EXPECT_EQ(choose_grouped_gemm_kn_config(262144, 4104, 4096, 128), kPingpong);   // n_out not in 256s
  EXPECT_EQ(choose_grouped_gemm_kn_config(0, 4096, 4096, 0), kPingpong);
}

// ---------------------------------------------------------------- GPU: kernel vs CPU loop

struct GemmCase {
  std::vector<int> rows_per_expert;
  int k, n_out;
  GemmTileConfig config;
};

using Launch = std::function<sonicmoe::Status(const GroupedGemmParams&)>;

// launch: run_grouped_gemm (the device's dispatch), or one kernel directly.
void run_case(const GemmCase& c, uint32_t seed, const Launch& launch = sonicmoe::run_grouped_gemm) {
  const int experts = static_cast<int>(c.rows_per_expert.size());
  std::vector<int32_t> offsets(experts + 1, 0);
  for (int e = 0; e < experts; ++e) offsets[e + 1] = offsets[e] + c.rows_per_expert[e];
  const int64_t m = offsets[experts];

  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<uint16_t> a(m * c.k), b(int64_t(experts) * c.n_out * c.k);
  for (auto& v : a) v = to_bf16(normal(rng));
  for (auto& v : b) v = to_bf16(normal(rng));

  int sm_count = 0;
  CUDA_OK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0));
  const size_t ws_bytes = sonicmoe::grouped_gemm_workspace_size(experts, sm_count);
  void *d_a, *d_b, *d_out, *d_ws;
  int32_t* d_off;
  CUDA_OK(cudaMalloc(&d_a, std::max<size_t>(a.size() * 2, 16)));
  CUDA_OK(cudaMalloc(&d_b, b.size() * 2));
  CUDA_OK(cudaMalloc(&d_out, std::max<size_t>(m * c.n_out * 2, 16)));
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&d_off), offsets.size() * 4));
  CUDA_OK(cudaMalloc(&d_ws, ws_bytes));
  CUDA_OK(cudaMemcpy(d_a, a.data(), a.size() * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d_b, b.data(), b.size() * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d_off, offsets.data(), offsets.size() * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(d_out, 0xff, m * c.n_out * 2));  // poison: bf16 0xffff is NaN

  GroupedGemmParams p;
  p.a = d_a;
  p.b = d_b;
  p.out = d_out;
  p.expert_offsets = d_off;
  p.m_total = m;
  p.k = c.k;
  p.n_out = c.n_out;
  p.num_experts = experts;
  p.workspace = d_ws;
  p.workspace_bytes = ws_bytes;
  p.sm_count = sm_count;
  p.config = c.config;
  const sonicmoe::Status st = launch(p);
  ASSERT_TRUE(st.ok()) << st.message;
  CUDA_OK(cudaDeviceSynchronize());

  std::vector<uint16_t> out(m * c.n_out);
  CUDA_OK(cudaMemcpy(out.data(), d_out, out.size() * 2, cudaMemcpyDeviceToHost));
  double err2 = 0, ref2 = 0;
  for (int e = 0; e < experts; ++e) {
    for (int r = offsets[e]; r < offsets[e + 1]; ++r) {
      for (int j = 0; j < c.n_out; ++j) {
        double acc = 0;
        const uint16_t* ar = &a[int64_t(r) * c.k];
        const uint16_t* br = &b[(int64_t(e) * c.n_out + j) * c.k];
        for (int kk = 0; kk < c.k; ++kk) acc += double(from_bf16(ar[kk])) * from_bf16(br[kk]);
        const float got = from_bf16(out[int64_t(r) * c.n_out + j]);
        ASSERT_TRUE(std::isfinite(got)) << "unwritten or non-finite output at row " << r << " col " << j;
        err2 += (got - acc) * (got - acc);
        ref2 += acc * acc;
      }
    }
  }
  if (m > 0) EXPECT_LE(std::sqrt(err2 / ref2), 1e-2);
  cudaFree(d_a);
  cudaFree(d_b);
  cudaFree(d_out);
  cudaFree(d_off);
  cudaFree(d_ws);
}

class SM90_GroupedGemm : public ::testing::TestWithParam<GemmTileConfig> {
 protected:
  void SetUp() override {
    if (!hopper_available()) GTEST_SKIP() << "needs a Hopper (sm_90) GPU";
  }
};

TEST_P(SM90_GroupedGemm, bf16_ragged_experts_with_empty_ones) {
  run_case({{0, 37, 128, 0, 1, 300, 0, 65}, 256, 384, GetParam()}, 1);
}

TEST_P(SM90_GroupedGemm, bf16_one_expert_holds_all_rows) {
  run_case({{0, 0, 777, 0}, 512, 256, GetParam()}, 2);
}

TEST_P(SM90_GroupedGemm, bf16_single_expert_k_not_multiple_of_tile) {
  run_case({{200}, 72, 136, GetParam()}, 3);
}

TEST_P(SM90_GroupedGemm, bf16_many_experts) {
  std::vector<int> rows(128);
  std::mt19937 rng(4);
  for (auto& r : rows) r = static_cast<int>(rng() % 40);
  run_case({rows, 128, 256, GetParam()}, 4);
}

TEST_P(SM90_GroupedGemm, bf16_many_tiles_per_cta_and_deep_k) {
  // More tiles than SMs, k loops longer than the stage ring (ping-pong turn order).
  std::vector<int> rows(64);
  std::mt19937 rng(5);
  for (auto& r : rows) r = static_cast<int>(rng() % 200);
  run_case({rows, 512, 256, GetParam()}, 5);
}

INSTANTIATE_TEST_SUITE_P(
    Configs, SM90_GroupedGemm,
    ::testing::Values(GemmTileConfig::kAuto, GemmTileConfig::kPingpong128x128x64,
                      GemmTileConfig::kPingpong64x128x128, GemmTileConfig::kCooperative128x256x64,
                      GemmTileConfig::kCooperative256x128x64, GemmTileConfig::kPingpong128x128x128,
                      GemmTileConfig::kPingpong128x128x64C1x1,
                      GemmTileConfig::kVarlenPingpong128x128x64,
                      GemmTileConfig::kVarlenCooperative128x256x64,
                      GemmTileConfig::kVarlenCooperative256x128x64,
                      GemmTileConfig::kVarlenCooperative128x256x64C2x1,
                      GemmTileConfig::kVarlenPingpong128x128x64C2x1,
                      GemmTileConfig::kVarlenPingpong128x192x64),
    [](const ::testing::TestParamInfo<GemmTileConfig>& info) {
      return std::string(sonicmoe::gemm_tile_config_name(info.param));
    });

#if SONICMOE_HAS_SM100
// The sm100 kernels, each called directly (sm100 takes only auto through run_grouped_gemm), and
// auto through the dispatch. Same cases and tolerance as sm90.
enum class Sm100Launch { kAuto, k1Sm, k2Sm };

class SM100_GroupedGemm : public ::testing::TestWithParam<Sm100Launch> {
 protected:
  void SetUp() override {
    if (!sonicmoe::test::blackwell_available()) GTEST_SKIP() << "needs a Blackwell sm_100 GPU (B200, GB200)";
  }
  static Launch launch() {
    using sonicmoe::sm100::GemmConfig;
    switch (GetParam()) {
      case Sm100Launch::k1Sm: return sonicmoe::sm100::run_grouped_gemm<GemmConfig::k1Sm128x256x64>;
      case Sm100Launch::k2Sm: return sonicmoe::sm100::run_grouped_gemm<GemmConfig::k2Sm256x256x64C2x1>;
      case Sm100Launch::kAuto: break;
    }
    return sonicmoe::run_grouped_gemm;
  }
};

TEST_P(SM100_GroupedGemm, bf16_ragged_experts_with_empty_ones) {
  run_case({{0, 37, 128, 0, 1, 300, 0, 65}, 256, 384, GemmTileConfig::kAuto}, 1, launch());
}

TEST_P(SM100_GroupedGemm, bf16_one_expert_holds_all_rows) {
  run_case({{0, 0, 777, 0}, 512, 256, GemmTileConfig::kAuto}, 2, launch());  // auto: the pair tile
}

TEST_P(SM100_GroupedGemm, bf16_single_expert_k_not_multiple_of_tile) {
  run_case({{200}, 72, 136, GemmTileConfig::kAuto}, 3, launch());
}

TEST_P(SM100_GroupedGemm, bf16_many_experts) {
  std::vector<int> rows(128);
  std::mt19937 rng(4);
  for (auto& r : rows) r = static_cast<int>(rng() % 40);
  run_case({rows, 128, 256, GemmTileConfig::kAuto}, 4, launch());
}

TEST_P(SM100_GroupedGemm, bf16_many_tiles_per_cta_and_deep_k) {
  std::vector<int> rows(64);
  std::mt19937 rng(5);
  for (auto& r : rows) r = static_cast<int>(rng() % 600);
  run_case({rows, 512, 256, GemmTileConfig::kAuto}, 5, launch());
}

INSTANTIATE_TEST_SUITE_P(Configs, SM100_GroupedGemm,
                         ::testing::Values(Sm100Launch::kAuto, Sm100Launch::k1Sm, Sm100Launch::k2Sm),
                         [](const ::testing::TestParamInfo<Sm100Launch>& info) {
                           return std::string(info.param == Sm100Launch::kAuto ? "auto"
                                              : info.param == Sm100Launch::k1Sm ? "sm100_1sm_128x256x64"
                                                                               : "sm100_2sm_256x256x64_c2x1");
                         });
#endif

}  // namespace
