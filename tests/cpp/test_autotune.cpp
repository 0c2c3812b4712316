// GoogleTest of the tile autotuner (csrc/host/autotune.h): the cache file's lines, the choice from
// measured times and the switch (anywhere); a kAuto call times, caches and reuses its choice
// (needs a Hopper GPU; skips elsewhere).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "host/autotune.h"
#include "sonicmoe.h"
#include "test_util.h"

namespace {

namespace at = sonicmoe::autotune;
using sonicmoe::GemmTileConfig;

at::Key some_key() {
  at::Key k;
  k.op = at::Op::kGroupedGemmKN;
  k.n_out = 2048;
  k.k = 1536;
  k.rows_bits = at::bit_width(262144);
  k.num_experts = 128;
  k.sm_count = 132;
  k.flags = 2;
  return k;
}

TEST(Autotune, bit_width_classes_rows_by_factors_of_two) {
  EXPECT_EQ(at::bit_width(0), 0);
  EXPECT_EQ(at::bit_width(1), 1);
  EXPECT_EQ(at::bit_width(2), 2);
  EXPECT_EQ(at::bit_width(3), 2);
  EXPECT_EQ(at::bit_width(262143), 18);
  EXPECT_EQ(at::bit_width(262144), 19);
}

TEST(Autotune, entry_round_trips) {
  const at::Key key = some_key();
  const std::string line = at::format_entry(key, GemmTileConfig::kVarlenCooperative128x256x64C2x1);
  EXPECT_NE(line.find("varlen_cooperative_128x256x64_c2x1"), std::string::npos) << line;
  at::Key back;
  GemmTileConfig config = GemmTileConfig::kAuto;
  ASSERT_TRUE(at::parse_entry(line, &back, &config)) << line;
  EXPECT_TRUE(back == key);
  EXPECT_EQ(config, GemmTileConfig::kVarlenCooperative128x256x64C2x1);
}

TEST(Autotune, malformed_lines_are_skipped) {
  at::Key key;
  GemmTileConfig config;
  const std::string good = at::format_entry(some_key(), GemmTileConfig::kVarlenPingpong128x128x64);
  EXPECT_TRUE(at::parse_entry(good, &key, &config));
  EXPECT_FALSE(at::parse_entry("", &key, &config));
  EXPECT_FALSE(at::parse_entry(good.substr(0, good.rfind(' ')), &key, &config)) << "cut before the name";
  EXPECT_FALSE(at::parse_entry("9 2048 1536 19 128 132 0 7 varlen_pingpong_128x128x64", &key, &config)) << "op";
  EXPECT_FALSE(at::parse_entry("3 2048 1536 19 128 132 0 0 auto", &key, &config)) << "auto is no choice";
  EXPECT_FALSE(at::parse_entry("3 2048 1536 19 128 132 0 13 x", &key, &config)) << "config past the enum";
  EXPECT_FALSE(at::parse_entry("3 2048 1536 19 128 132 0 7 varlen_cooperative_128x256x64", &key, &config))
      << "the name must be the number's";
}

TEST(Autotune, choice_keeps_the_rule_within_the_margin) {
  const std::vector<GemmTileConfig> c{GemmTileConfig::kVarlenPingpong128x128x64,
                                      GemmTileConfig::kVarlenCooperative128x256x64,
                                      GemmTileConfig::kVarlenCooperative128x256x64C2x1};
  const GemmTileConfig rule = GemmTileConfig::kVarlenPingpong128x128x64;
  EXPECT_EQ(at::choose_fastest(c, {1.000f, 0.995f, 1.2f}, rule), 0) << "0.5% faster: noise, the rule stays";
  EXPECT_EQ(at::choose_fastest(c, {1.000f, 0.95f, 0.97f}, rule), 1) << "5% faster replaces it";
  EXPECT_EQ(at::choose_fastest(c, {-1.0f, 1.1f, 1.0f}, rule), 2) << "the rule's config failed";
  EXPECT_EQ(at::choose_fastest(c, {1.0f, 0.5f, 0.4f}, GemmTileConfig::kVarlenCooperative256x128x64), 2)
      << "a rule outside the candidates: the fastest";
  EXPECT_EQ(at::choose_fastest(c, {-1.0f, -1.0f, -1.0f}, rule), -1);
}

TEST(Autotune, switch_reads_the_environment) {
  ASSERT_EQ(setenv("SONICMOE_AUTOTUNE", "0", 1), 0);
  EXPECT_FALSE(at::enabled());
  ASSERT_EQ(setenv("SONICMOE_AUTOTUNE", "1", 1), 0);
  EXPECT_TRUE(at::enabled());
  ASSERT_EQ(unsetenv("SONICMOE_AUTOTUNE"), 0);
  EXPECT_TRUE(at::enabled());
}

TEST(Autotune, settle_reads_the_environment_and_names_a_bad_value) {
  double ms = -1.0;
  ASSERT_EQ(unsetenv("SONICMOE_AUTOTUNE_SETTLE_MS"), 0);
  ASSERT_TRUE(at::settle_ms(&ms).ok());
  EXPECT_EQ(ms, at::kSettleMs);
  ASSERT_EQ(setenv("SONICMOE_AUTOTUNE_SETTLE_MS", "0", 1), 0);
  ASSERT_TRUE(at::settle_ms(&ms).ok());
  EXPECT_EQ(ms, 0.0);
  ASSERT_EQ(setenv("SONICMOE_AUTOTUNE_SETTLE_MS", "62.5", 1), 0);
  ASSERT_TRUE(at::settle_ms(&ms).ok());
  EXPECT_EQ(ms, 62.5);
  for (const char* bad : {"", "abc", "-1", "10ms", "nan", "1e9"}) {
    ASSERT_EQ(setenv("SONICMOE_AUTOTUNE_SETTLE_MS", bad, 1), 0);
    const sonicmoe::Status st = at::settle_ms(&ms);
    EXPECT_FALSE(st.ok()) << bad;
    EXPECT_NE(st.message.find("SONICMOE_AUTOTUNE_SETTLE_MS='" + std::string(bad) + "'"), std::string::npos)
        << st.message;
  }
  ASSERT_EQ(unsetenv("SONICMOE_AUTOTUNE_SETTLE_MS"), 0);
}

TEST(Autotune, contenders_are_within_the_ratio_of_the_fastest) {
  const std::vector<bool> keep = at::contenders({2.0f, 2.9f, 3.0f, 3.1f, -1.0f});
  EXPECT_EQ(keep, (std::vector<bool>{true, true, true, false, false}))
      << "1.5x the fastest stays, past it or failed is left out";
  EXPECT_EQ(at::contenders({-1.0f, -1.0f}), (std::vector<bool>{false, false})) << "none sized: none goes on";
  EXPECT_EQ(at::contenders({0.5f}), (std::vector<bool>{true}));
}

TEST(Autotune, settle_fills_its_time_within_bounds) {
  EXPECT_EQ(at::settle_launches(150.0, 5.0f), 30) << "a 5 ms kernel: 30 launches";
  EXPECT_EQ(at::settle_launches(150.0, 4.0f), 38) << "rounded up";
  EXPECT_EQ(at::settle_launches(150.0, 0.01f), at::kMaxSettleLaunches) << "a small kernel: capped";
  EXPECT_EQ(at::settle_launches(150.0, 500.0f), 1) << "at least one";
  EXPECT_EQ(at::settle_launches(0.0, 5.0f), 1) << "no settle: one launch";
  EXPECT_EQ(at::settle_launches(150.0, -1.0f), 1) << "time unknown";
}

// ---------------------------------------------------------------- GPU

int count_lines(const std::string& path) {
  std::ifstream f(path);
  int n = 0;
  for (std::string line; std::getline(f, line);) ++n;
  return n;
}

TEST(SM90_Autotune, auto_call_times_once_caches_and_reuses) {
  if (!sonicmoe::test::hopper_available()) GTEST_SKIP() << "needs a Hopper (sm_90) GPU";
  char dir_template[] = "/tmp/sonicmoe_autotune_XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  ASSERT_EQ(setenv("SONICMOE_CACHE_DIR", dir_template, 1), 0);
  at::clear_memory();
  const std::string path = at::cache_path();
  ASSERT_EQ(path.rfind(dir_template, 0), 0u) << path;

  const int experts = 4, k = 256, n_out = 384;
  const std::vector<int32_t> offsets{0, 100, 100, 356, 500};
  int sm_count = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  const size_t ws_bytes = sonicmoe::grouped_gemm_workspace_size(experts, sm_count);
  void *a, *b, *out, *ws;
  int32_t* off;
  ASSERT_EQ(cudaMalloc(&a, 500 * k * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&b, experts * n_out * k * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&out, 500 * n_out * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&off), offsets.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&ws, ws_bytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(a, 0, 500 * k * 2), cudaSuccess);
  ASSERT_EQ(cudaMemset(b, 0, experts * n_out * k * 2), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(off, offsets.data(), offsets.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  sonicmoe::GroupedGemmParams p;
  p.a = a;
  p.b = b;
  p.out = out;
  p.expert_offsets = off;
  p.m_total = 500;
  p.k = k;
  p.n_out = n_out;
  p.num_experts = experts;
  p.workspace = ws;
  p.workspace_bytes = ws_bytes;
  p.sm_count = sm_count;

  sonicmoe::Status st = sonicmoe::run_grouped_gemm(p);
  ASSERT_TRUE(st.ok()) << st.message;
  EXPECT_EQ(count_lines(path), 1) << "the first kAuto call of a class tunes it and writes its line";
  st = sonicmoe::run_grouped_gemm(p);
  ASSERT_TRUE(st.ok()) << st.message;
  EXPECT_EQ(count_lines(path), 1) << "the second reuses it";
  at::clear_memory();
  st = sonicmoe::run_grouped_gemm(p);
  ASSERT_TRUE(st.ok()) << st.message;
  EXPECT_EQ(count_lines(path), 1) << "a new process's first call reads the file";
  p.m_total = 300;  // bit width 9, as 500's: the same class
  std::vector<int32_t> fewer{0, 100, 100, 256, 300};
  ASSERT_EQ(cudaMemcpy(off, fewer.data(), fewer.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  st = sonicmoe::run_grouped_gemm(p);
  ASSERT_TRUE(st.ok()) << st.message;
  EXPECT_EQ(count_lines(path), 1);

  // Captured into a CUDA graph: a new class is not tuned (no sync may run while capturing).
  p.n_out = 256;
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  p.stream = stream;
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  st = sonicmoe::run_grouped_gemm(p);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_TRUE(st.ok()) << st.message;
  EXPECT_EQ(count_lines(path), 1) << "captured: the rule's pick, nothing timed";
  cudaGraphDestroy(graph);

  ASSERT_EQ(setenv("SONICMOE_AUTOTUNE", "0", 1), 0);
  st = sonicmoe::run_grouped_gemm(p);
  ASSERT_TRUE(st.ok()) << st.message;
  EXPECT_EQ(count_lines(path), 1) << "off: rules only";
  ASSERT_EQ(unsetenv("SONICMOE_AUTOTUNE"), 0);
  st = sonicmoe::run_grouped_gemm(p);
  ASSERT_TRUE(st.ok()) << st.message;
  EXPECT_EQ(count_lines(path), 2) << "on again: the new class is tuned";
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaStreamDestroy(stream);
  for (void* ptr : {a, b, out, static_cast<void*>(off), ws}) cudaFree(ptr);
  std::remove(path.c_str());
  unsetenv("SONICMOE_CACHE_DIR");
  at::clear_memory();
}

}  // namespace
