// GoogleTest of the backward through the down-projection (K4): host rules (run anywhere).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "sm90/heuristics.h"
#include "sonicmoe.h"
#include "test_util.h"

namespace {

using sonicmoe::DownProjGradParams;

DownProjGradParams valid_shape() { return sonicmoe::test::expert_mlp_shape<DownProjGradParams>(); }

TEST(DownProjGradHost, rejects_bad_shapes_naming_argument_value_rule) {
  const sonicmoe::test::RejectionCase<DownProjGradParams> cases[] = {
      {[](DownProjGradParams& p) { p.num_experts = 0; }, "down_proj_grad: num_experts = 0 breaks the rule: must be >= 1"},
      {[](DownProjGradParams& p) { p.m_total = -1; }, "down_proj_grad: m_total = -1 breaks the rule"},
      {[](DownProjGradParams& p) { p.d = 100; }, "down_proj_grad: d = 100 breaks the rule: must be a positive multiple of 8"},
      {[](DownProjGradParams& p) { p.n = 4; }, "down_proj_grad: n = 4 breaks the rule"},
      {[](DownProjGradParams& p) { p.sm_count = 0; }, "down_proj_grad: sm_count = 0 breaks the rule"},
      {[](DownProjGradParams& p) { p.config = sonicmoe::GemmTileConfig::kPingpong128x128x64; },
       "down_proj_grad: config = 1 breaks the rule: must be 0 (auto) or a varlen configuration (7 to 11)"},
      {[](DownProjGradParams& p) { p.m_total = INT32_MAX; p.n = 1 << 20; }, "tiles must fit in int32"},
      {[](DownProjGradParams& p) { p.activation = static_cast<sonicmoe::GluActivation>(-1); },
       "down_proj_grad: activation = -1 breaks the rule: must name a GluActivation"},
  };
  sonicmoe::test::expect_rejections(valid_shape(), cases, &sonicmoe::check_down_proj_grad);
}

TEST(DownProjGradHost, run_rejects_null_pointers_before_any_launch) {
  EXPECT_NE(sonicmoe::run_down_proj_grad(valid_shape()).message.find("must be non-null"), std::string::npos);
}

TEST(ZeroRowsPastEnd, rejects_null_pointers_and_partial_vectors_before_any_launch) {
  alignas(16) static char buf[64];
  const int32_t* end_row = reinterpret_cast<const int32_t*>(buf);
  using sonicmoe::run_zero_rows_past_end;
  auto message = [&](const int32_t* end, void* data, int64_t row_bytes) {
    return run_zero_rows_past_end(end, 10, 64, {{buf, 32}, {data, row_bytes}}, nullptr).message;
  };
  EXPECT_TRUE(run_zero_rows_past_end(nullptr, 0, 64, {{nullptr, 32}}, nullptr).ok());  // no rows: nothing to do
  EXPECT_NE(message(nullptr, buf, 32).find("must be non-null"), std::string::npos);
  EXPECT_NE(message(end_row, nullptr, 32).find("must be non-null"), std::string::npos);
  EXPECT_NE(message(end_row, buf, 24).find("whole 16-byte vectors"), std::string::npos);
  EXPECT_NE(message(end_row, buf + 8, 32).find("16-byte aligned"), std::string::npos);
  EXPECT_NE(run_zero_rows_past_end(end_row, 10, 64, {{buf, 32}, {buf, 32}, {buf, 32}}, nullptr).message.find(
                "zero_rows_past_end: buffers = 3 breaks the rule: must be at most 2 per launch"),
            std::string::npos);
}

TEST(DownProjGradHost, heuristic_takes_the_clustered_wide_tile_where_n_fills_it_and_d_is_at_least_2048) {
  using sonicmoe::sm90::choose_down_proj_grad_config;
  constexpr auto kWide = sonicmoe::GemmTileConfig::kVarlenCooperative128x256x64C2x1;
  constexpr auto kPingpong = sonicmoe::GemmTileConfig::kVarlenPingpong128x128x64;
  EXPECT_EQ(choose_down_proj_grad_config(1536, 4096), kWide);     // qwen3-235b-a22b
  EXPECT_EQ(choose_down_proj_grad_config(512, 4096), kWide);      // paper-30b-n512
  EXPECT_EQ(choose_down_proj_grad_config(2048, 7168), kWide);     // deepseek-v3
  EXPECT_EQ(choose_down_proj_grad_config(1024, 2048), kWide);     // olmoe-1b-7b
  EXPECT_EQ(choose_down_proj_grad_config(768, 2048), kWide);      // qwen3-30b-a3b
  EXPECT_EQ(choose_down_proj_grad_config(256, 1536), kPingpong);  // paper-7b-n256
  EXPECT_EQ(choose_down_proj_grad_config(1024, 1536), kPingpong); // paper-7b-n1024
  EXPECT_EQ(choose_down_proj_grad_config(384, 4096), kPingpong);  // a half-empty last tile
}

}  // namespace
