// GoogleTest of the expert weight gradients (K5, K7): host rules (run anywhere).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "sm90/heuristics.h"
#include "sonicmoe.h"
#include "test_util.h"

namespace {

using sonicmoe::WeightGradParams;

WeightGradParams valid_shape() { return sonicmoe::test::weight_grad_shape(); }

TEST(WeightGradHost, accepts_the_cooperative_tile_matching_the_gathered_side) {
  WeightGradParams p = valid_shape();  // gathers b (x)
  p.config = sonicmoe::GemmTileConfig::kVarlenCooperative256x128x64;
  EXPECT_EQ(sonicmoe::check_weight_grad(p), "");
  p.gather_a = true;
  p.config = sonicmoe::GemmTileConfig::kVarlenCooperative128x256x64;
  EXPECT_EQ(sonicmoe::check_weight_grad(p), "");
  p.config = sonicmoe::GemmTileConfig::kVarlenCooperative128x256x64C2x1;  // clustered, either gather
  EXPECT_EQ(sonicmoe::check_weight_grad(p), "");
  p.gather_a = false;
  EXPECT_EQ(sonicmoe::check_weight_grad(p), "");
}

TEST(WeightGradHost, auto_takes_the_cooperative_tile_of_the_gathered_side_where_every_row_is_written) {
  using sonicmoe::GemmTileConfig;
  using sonicmoe::sm90::choose_weight_grad_config;
  EXPECT_EQ(choose_weight_grad_config(true, false, 1000, 8, 256, 512), GemmTileConfig::kVarlenCooperative128x256x64);
  EXPECT_EQ(choose_weight_grad_config(false, false, 1000, 8, 512, 256), GemmTileConfig::kVarlenCooperative256x128x64);
  EXPECT_EQ(choose_weight_grad_config(true, true, 1000, 8, 256, 512), GemmTileConfig::kVarlenPingpong128x128x64);
  EXPECT_EQ(choose_weight_grad_config(false, false, 0, 8, 512, 256), GemmTileConfig::kVarlenPingpong128x128x64);
}

TEST(WeightGradHost, auto_clusters_the_cooperative_tile_where_experts_average_2048_rows_or_outputs_are_large) {
  using sonicmoe::GemmTileConfig;
  using sonicmoe::sm90::choose_weight_grad_config;
  constexpr auto kClustered = GemmTileConfig::kVarlenCooperative128x256x64C2x1;
  // olmoe-1b-7b (4096 rows per expert), qwen3-30b-a3b (2048): clustered; paper-7b (1536 rows,
  // outputs of at most 3.1M elements): not; deepseek-v3 (512 rows, 14.7M / 29.4M): clustered.
  EXPECT_EQ(choose_weight_grad_config(false, false, 32768 * 8, 64, 2048, 2048), kClustered);
  EXPECT_EQ(choose_weight_grad_config(true, false, 32768 * 8, 128, 2048, 768), kClustered);
  EXPECT_EQ(choose_weight_grad_config(true, false, 24576 * 8, 128, 1536, 256), GemmTileConfig::kVarlenCooperative128x256x64);
  EXPECT_EQ(choose_weight_grad_config(false, false, 24576 * 2, 32, 2048, 1536), GemmTileConfig::kVarlenCooperative256x128x64);
  EXPECT_EQ(choose_weight_grad_config(true, false, 16384 * 8, 256, 7168, 2048), kClustered);
  EXPECT_EQ(choose_weight_grad_config(false, false, 16384 * 8, 256, 4096, 7168), kClustered);
  EXPECT_EQ(choose_weight_grad_config(false, true, 32768 * 8, 64, 2048, 2048), GemmTileConfig::kVarlenPingpong128x128x64);
}

TEST(WeightGradHost, accepts_anchor_shapes) {
  for (const auto& s : sonicmoe::test::kAnchorShapes) {
    WeightGradParams p = valid_shape();
    p.num_experts = s.num_experts;
    p.m_out = s.d, p.n_out = s.n;  // dW2
    EXPECT_EQ(sonicmoe::check_weight_grad(p), "") << "d=" << s.d << " n=" << s.n;
    p.m_out = 2 * s.n, p.n_out = s.d;  // dW1
    EXPECT_EQ(sonicmoe::check_weight_grad(p), "") << "d=" << s.d << " n=" << s.n;
  }
}

TEST(WeightGradHost, rejects_bad_shapes_naming_argument_value_rule) {
  const sonicmoe::test::RejectionCase<WeightGradParams> cases[] = {
      {[](WeightGradParams& p) { p.num_experts = 0; }, "weight_grad: num_experts = 0 breaks the rule: must be >= 1"},
      {[](WeightGradParams& p) { p.num_tokens = -1; }, "num_tokens = -1 breaks the rule"},
      {[](WeightGradParams& p) { p.m_total = int64_t(1) << 31; }, "m_total = 2147483648 breaks"},
      {[](WeightGradParams& p) { p.m_out = 100; }, "m_out = 100 breaks the rule: must be a positive multiple of 8"},
      {[](WeightGradParams& p) { p.n_out = 0; }, "n_out = 0 breaks the rule"},
      {[](WeightGradParams& p) { p.sm_count = 0; }, "sm_count = 0 breaks the rule"},
      {[](WeightGradParams& p) { p.num_experts = 1 << 20; p.m_out = 1 << 12; }, "output rows must fit in int32"},
      {[](WeightGradParams& p) { p.config = sonicmoe::GemmTileConfig::kPingpong128x128x64; },
       "weight_grad: config = 1 breaks the rule: must be 0 (auto), 7"},
      {[](WeightGradParams& p) { p.config = sonicmoe::GemmTileConfig::kVarlenCooperative128x256x64; },
       "weight_grad: config = 8 breaks the rule: must not be 8 without gather_a"},
      {[](WeightGradParams& p) {
         p.gather_a = true;
         p.config = sonicmoe::GemmTileConfig::kVarlenCooperative256x128x64;
       },
       "weight_grad: config = 9 breaks the rule: must not be 9 with gather_a"},
  };
  sonicmoe::test::expect_rejections(valid_shape(), cases, &sonicmoe::check_weight_grad);
}

TEST(WeightGradHost, run_rejects_null_and_misaligned_pointers_before_any_launch) {
  WeightGradParams p = valid_shape();
  EXPECT_NE(sonicmoe::run_weight_grad(p).message.find("must be non-null"), std::string::npos);
  alignas(16) static char buf[64];
  p.a = buf + 2;
  p.b = p.out = buf;
  p.expert_offsets = p.gather_idx = reinterpret_cast<const int32_t*>(buf);
  EXPECT_NE(sonicmoe::run_weight_grad(p).message.find("16-byte aligned"), std::string::npos);
}

}  // namespace
