// GoogleTest: per-device dispatch (which kernel family an op runs on a GPU, and the errors where
// this build holds none) and the host rules of the sm100 grouped GEMM, up-projection, its backward
// and the weight gradients. Pure host logic: runs anywhere.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "common/grouped_gemm_workspace.h"
#include "sm100/grouped_gemm_sm100.h"
#include "sm100/heuristics.h"
#include "sonicmoe.h"
#include "test_util.h"

namespace {

using sonicmoe::BuiltArchs;
using sonicmoe::KernelArch;
using sonicmoe::choose_kernel_arch;

constexpr BuiltArchs kSm90Only{true, false};
constexpr BuiltArchs kSm100Only{false, true};
constexpr BuiltArchs kBoth{true, true};

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(DeviceArch, families_are_exact_compute_capabilities) {
  EXPECT_EQ(sonicmoe::arch_family(9, 0), 90);
  EXPECT_EQ(sonicmoe::arch_family(10, 0), 100);
  EXPECT_EQ(sonicmoe::arch_family(10, 3), 0);  // B300: sm_103, sm_100a cubins do not load
  EXPECT_EQ(sonicmoe::arch_family(8, 0), 0);
  EXPECT_EQ(sonicmoe::arch_family(8, 9), 0);
  EXPECT_EQ(sonicmoe::arch_family(12, 0), 0);
}

TEST(DeviceArch, built_archs_are_the_cmake_list) {
  const BuiltArchs built = sonicmoe::built_archs();
  EXPECT_EQ(built.sm90, SONICMOE_HAS_SM90 != 0);
  EXPECT_EQ(built.sm100, SONICMOE_HAS_SM100 != 0);
}

TEST(DeviceArch, hopper_runs_sm90_where_built) {
  const auto hopper = choose_kernel_arch("grouped_gemm", 9, 0, kSm90Only);
  EXPECT_EQ(hopper.arch, KernelArch::kSm90);
  EXPECT_TRUE(hopper.error.empty());
  EXPECT_EQ(choose_kernel_arch("up_proj", 9, 0, kBoth).arch, KernelArch::kSm90);
  const auto c = choose_kernel_arch("up_proj", 9, 0, kSm100Only);
  EXPECT_EQ(c.arch, KernelArch::kNone);
  EXPECT_EQ(c.error, "up_proj: the GPU is sm_90 (compute capability 9.0) but this build holds sm_100a kernels "
                     "only: rebuild with SONICMOE_CUDA_ARCHS=\"90a\" or \"90a;100a\"");
}

// Every op has kernels for both families (the plain CUDA routing and combines too), so the op
// only names itself in the message: sm100 on a B200 where built, sm90 on a Hopper, the rebuild
// named where the GPU's family is missing, and no sm_103 (B300).
TEST(DeviceArch, every_op_runs_on_either_family_where_built) {
  for (const std::string op : {"grouped_gemm", "grouped_gemm (b_layout KN)", "grouped_gemm_kn", "up_proj",
                               "down_proj_grad", "weight_grad", "combine", "combine_dx", "routing_metadata",
                               "router_topk", "router_backward", "token_rounding_assign", "dense_layout"}) {
    EXPECT_EQ(choose_kernel_arch(op.c_str(), 10, 0, kBoth).arch, KernelArch::kSm100) << op;
    EXPECT_EQ(choose_kernel_arch(op.c_str(), 10, 0, kSm100Only).arch, KernelArch::kSm100) << op;
    EXPECT_EQ(choose_kernel_arch(op.c_str(), 9, 0, kBoth).arch, KernelArch::kSm90) << op;
    EXPECT_EQ(choose_kernel_arch(op.c_str(), 9, 0, kSm90Only).arch, KernelArch::kSm90) << op;
    EXPECT_EQ(choose_kernel_arch(op.c_str(), 10, 3, kBoth).arch, KernelArch::kNone) << op;  // B300: not sm_100a
    const auto no_sm100 = choose_kernel_arch(op.c_str(), 10, 0, kSm90Only);
    EXPECT_EQ(no_sm100.arch, KernelArch::kNone) << op;
    EXPECT_EQ(no_sm100.error, op + ": the GPU is sm_100 (compute capability 10.0) but this build holds sm_90a "
                                   "kernels only: rebuild with SONICMOE_CUDA_ARCHS=\"90a;100a\"");
    const auto no_sm90 = choose_kernel_arch(op.c_str(), 9, 0, kSm100Only);
    EXPECT_EQ(no_sm90.arch, KernelArch::kNone) << op;
    EXPECT_TRUE(contains(no_sm90.error, "rebuild with SONICMOE_CUDA_ARCHS=\"90a\" or \"90a;100a\"")) << no_sm90.error;
  }
}

TEST(DeviceArch, b300_is_not_sm100a) {
  // Arch-specific ('a') cubins load on their exact compute capability only: sm_100a not on 10.3.
  const auto c = choose_kernel_arch("grouped_gemm", 10, 3, kBoth);
  EXPECT_EQ(c.arch, KernelArch::kNone);
  EXPECT_TRUE(contains(c.error, "grouped_gemm: the GPU is sm_103 (compute capability 10.3)")) << c.error;
  EXPECT_TRUE(contains(c.error, "load on compute capability 10.0 only (B200, GB200)")) << c.error;
  EXPECT_TRUE(contains(c.error, "no sm_103a kernels are built")) << c.error;
}

TEST(DeviceArch, other_gpus_are_refused_by_name) {
  for (auto [major, minor] : {std::pair{8, 0}, std::pair{12, 0}, std::pair{8, 9}}) {
    const auto c = choose_kernel_arch("combine", major, minor, kBoth);
    EXPECT_EQ(c.arch, KernelArch::kNone);
    const std::string gpu = "combine: the GPU is sm_" + std::to_string(major) + std::to_string(minor) +
                            " (compute capability " + std::to_string(major) + "." + std::to_string(minor) + ")";
    EXPECT_TRUE(contains(c.error, gpu)) << c.error;
    EXPECT_TRUE(contains(c.error, "this build holds sm_90a and sm_100a kernels")) << c.error;
  }
  EXPECT_TRUE(contains(choose_kernel_arch("combine", 8, 0, kSm90Only).error,
                       "this build holds sm_90a kernels only"));
}

// ---------------------------------------------------------------- sm100 grouped GEMM host rules

TEST(GroupedGemmSm100Host, auto_takes_the_pair_tile_where_experts_average_256_rows) {
  using sonicmoe::sm100::GemmConfig;
  using sonicmoe::sm100::choose_grouped_gemm_config;
  EXPECT_EQ(choose_grouped_gemm_config(256 * 128, 4096, 1024, 128), GemmConfig::k2Sm256x256x64C2x1);
  EXPECT_EQ(choose_grouped_gemm_config(256 * 128 - 1, 4096, 1024, 128), GemmConfig::k1Sm128x256x64);
  EXPECT_EQ(choose_grouped_gemm_config(262144, 7168, 2048, 256), GemmConfig::k2Sm256x256x64C2x1);  // 1024 rows
  EXPECT_EQ(choose_grouped_gemm_config(32768, 7168, 2048, 256), GemmConfig::k1Sm128x256x64);      // 128 rows
  EXPECT_EQ(choose_grouped_gemm_config(0, 4096, 1024, 8), GemmConfig::k1Sm128x256x64);
  EXPECT_EQ(choose_grouped_gemm_config(1000, 4096, 1024, 0), GemmConfig::k1Sm128x256x64);
}

TEST(GroupedGemmSm100Host, shapes_are_the_instantiated_ones) {
  using sonicmoe::sm100::GemmConfig;
  constexpr auto one = sonicmoe::sm100::gemm_shape(GemmConfig::k1Sm128x256x64);
  constexpr auto pair = sonicmoe::sm100::gemm_shape(GemmConfig::k2Sm256x256x64C2x1);
  EXPECT_EQ(one.m * 1000 + one.n, 128256);
  EXPECT_FALSE(one.two_sm);
  EXPECT_EQ(one.cluster_m * one.cluster_n, 1);
  EXPECT_EQ(pair.m * 1000 + pair.n, 256256);
  EXPECT_TRUE(pair.two_sm);
  EXPECT_EQ(pair.cluster_m, 2);  // the 2-SM MMA spans the CTA pair of a 2 x 1 cluster
}

sonicmoe::GroupedGemmParams sm100_shape() {
  sonicmoe::GroupedGemmParams p;
  p.m_total = 4096;
  p.k = 1024;
  p.n_out = 4096;
  p.num_experts = 8;
  p.sm_count = 148;
  return p;
}

TEST(GroupedGemmSm100Host, takes_auto_only_and_names_the_rule) {
  sonicmoe::GroupedGemmParams p = sm100_shape();
  EXPECT_EQ(sonicmoe::sm100::check_grouped_gemm(p), "");
  p.config = sonicmoe::GemmTileConfig::kCooperative128x256x64;
  EXPECT_EQ(sonicmoe::sm100::check_grouped_gemm(p),
            "grouped_gemm: config = 3 breaks the rule: must be 0 (auto) on an sm_100 GPU in this build (the other "
            "GemmTileConfigs are sm90 kernels); auto picks 2-SM 256x256x64 (2x1 cluster) where experts average "
            ">= 256 rows, else 1-SM 128x256x64");
  p.config = sonicmoe::GemmTileConfig::kAuto;
  p.partial_rows = true;  // token rounding's buffers: the rows past offsets[E] belong to no group
  EXPECT_EQ(sonicmoe::sm100::check_grouped_gemm(p), "");
}

// K6 (b_layout KN) on sm100: the same rules, with the router addend (fused in the epilogue).
TEST(GroupedGemmSm100Host, kn_takes_auto_the_addend_and_partial_rows_and_refuses_explicit_tiles) {
  sonicmoe::GroupedGemmParams p = sm100_shape();
  p.b_layout = sonicmoe::WeightLayout::kKN;
  EXPECT_EQ(sonicmoe::sm100::check_grouped_gemm(p), "");
  float scale = 0;
  uint16_t rows[8] = {};
  p.addend_scale = &scale;
  p.addend_rows = rows;
  EXPECT_EQ(sonicmoe::sm100::check_grouped_gemm(p), "");
  EXPECT_EQ(sonicmoe::check_grouped_gemm(p), "");
  p.config = sonicmoe::GemmTileConfig::kVarlenPingpong128x128x64;  // KN's sm90 kernel: refused on sm100
  EXPECT_EQ(sonicmoe::check_grouped_gemm(p), "");
  EXPECT_TRUE(contains(sonicmoe::sm100::check_grouped_gemm(p),
                       "grouped_gemm: config = 7 breaks the rule: must be 0 (auto) on an sm_100 GPU"));
  p.config = sonicmoe::GemmTileConfig::kAuto;
  p.partial_rows = true;  // token rounding's buffers: the rows past offsets[E] belong to no group
  EXPECT_EQ(sonicmoe::sm100::check_grouped_gemm(p), "");
}

// ---------------------------------------------------------------- sm100 up-projection host rules

TEST(UpProjSm100Host, auto_takes_the_one_configuration) {
  using sonicmoe::sm100::UpProjConfig;
  for (int64_t n : {8, 256, 768, 1024, 2048, 8192})
    for (int64_t d : {8, 1024, 4096, 7168})
      EXPECT_EQ(sonicmoe::sm100::choose_up_proj_config(n, d), UpProjConfig::k1Sm128x256x64) << n << " x " << d;
  EXPECT_STREQ(sonicmoe::sm100::up_proj_config_name(UpProjConfig::k1Sm128x256x64), "sm100_1sm_128x256x64");
}

// The tile the kernel instantiates: one TMEM lane per row (M 128, 1-SM MMA), 128 gate and 128 up
// columns, two fp32 accumulators in TMEM's 512 columns, and a 4-stage ring in a CTA's 227 KB.
TEST(UpProjSm100Host, shape_fits_tmem_and_shared_memory) {
  constexpr auto s = sonicmoe::sm100::up_proj_shape(sonicmoe::sm100::UpProjConfig::k1Sm128x256x64);
  EXPECT_EQ(s.m, 128);
  EXPECT_EQ(s.n, 256);
  EXPECT_EQ(s.k, 64);
  EXPECT_LE(2 * s.n, 512);                                    // two accumulators, one TMEM column each
  const int stage_bytes = (s.m + s.n) * s.k * 2;                // A and B of a stage, bf16
  EXPECT_LE(s.stages * stage_bytes + 1024, 227 * 1024);        // plus barriers and alignment
  EXPECT_GT((s.stages + 1) * stage_bytes, 227 * 1024);         // the most stages that fit
}

TEST(UpProjSm100Host, takes_auto_only_and_names_the_rule) {
  auto p = sonicmoe::test::expert_mlp_shape<sonicmoe::UpProjParams>();
  EXPECT_EQ(sonicmoe::check_up_proj(p), "");
  EXPECT_EQ(sonicmoe::sm100::check_up_proj(p), "");
  p.partial_rows = true;  // the varlen scheduler walks offsets[E] only: rows past it are not written
  EXPECT_EQ(sonicmoe::sm100::check_up_proj(p), "");
  for (int a = 0; a < sonicmoe::kNumGluActivations; ++a) {
    p.activation = static_cast<sonicmoe::GluActivation>(a);
    EXPECT_EQ(sonicmoe::sm100::check_up_proj(p), "");
  }
  p.config = sonicmoe::GemmTileConfig::kVarlenCooperative128x256x64;  // valid on sm90 ...
  EXPECT_EQ(sonicmoe::check_up_proj(p), "");
  EXPECT_EQ(sonicmoe::sm100::check_up_proj(p),  // ... refused on sm100, naming the rule
            "up_proj: config = 8 breaks the rule: must be 0 (auto) on an sm_100 GPU in this build (the other "
            "GemmTileConfigs are sm90 kernels); auto picks 1-SM 128x256x64, the one sm100 K1 configuration so far");
}

// ---------------------------------------------------------------- sm100 down_proj_grad host rules

TEST(DownProjGradSm100Host, auto_takes_the_one_configuration) {
  using sonicmoe::sm100::DownProjGradConfig;
  for (int64_t n : {8, 256, 768, 1024, 2048, 8192})
    for (int64_t d : {8, 1024, 4096, 7168})
      EXPECT_EQ(sonicmoe::sm100::choose_down_proj_grad_config(n, d), DownProjGradConfig::k1Sm128x256x64)
          << n << " x " << d;
  EXPECT_STREQ(sonicmoe::sm100::down_proj_grad_config_name(DownProjGradConfig::k1Sm128x256x64),
               "sm100_1sm_128x256x64");
}

// K4's tile: one TMEM lane per row, 256 columns of n (whole 128-column score slots), two fp32
// accumulators in TMEM's 512 columns, whole 64-column B boxes (w2 read N-major), 4 stages in 227 KB.
TEST(DownProjGradSm100Host, shape_fits_tmem_shared_memory_and_the_score_slots) {
  constexpr auto s = sonicmoe::sm100::down_proj_grad_shape(sonicmoe::sm100::DownProjGradConfig::k1Sm128x256x64);
  EXPECT_EQ(s.m, 128);
  EXPECT_EQ(s.n, 256);
  EXPECT_EQ(s.k, 64);
  EXPECT_EQ(s.n % sonicmoe::kDownProjGradBlockCols, 0);
  EXPECT_EQ(s.n % 64, 0);
  EXPECT_LE(2 * s.n, 512);
  const int stage_bytes = (s.m + s.n) * s.k * 2;
  EXPECT_LE(s.stages * stage_bytes + 1024, 227 * 1024);
  EXPECT_GT((s.stages + 1) * stage_bytes, 227 * 1024);
}

TEST(DownProjGradSm100Host, takes_auto_only_and_names_the_rule) {
  auto p = sonicmoe::test::expert_mlp_shape<sonicmoe::DownProjGradParams>();
  EXPECT_EQ(sonicmoe::check_down_proj_grad(p), "");
  EXPECT_EQ(sonicmoe::sm100::check_down_proj_grad(p), "");
  p.partial_rows = true;
  EXPECT_EQ(sonicmoe::sm100::check_down_proj_grad(p), "");
  for (int a = 0; a < sonicmoe::kNumGluActivations; ++a) {
    p.activation = static_cast<sonicmoe::GluActivation>(a);
    EXPECT_EQ(sonicmoe::sm100::check_down_proj_grad(p), "");
  }
  p.config = sonicmoe::GemmTileConfig::kVarlenCooperative128x256x64;  // valid on sm90 ...
  EXPECT_EQ(sonicmoe::check_down_proj_grad(p), "");
  EXPECT_EQ(sonicmoe::sm100::check_down_proj_grad(p),  // ... refused on sm100, naming the rule
            "down_proj_grad: config = 8 breaks the rule: must be 0 (auto) on an sm_100 GPU in this build (the "
            "other GemmTileConfigs are sm90 kernels); auto picks 1-SM 128x256x64, the one sm100 down_proj_grad "
            "configuration so far");
}

// ---------------------------------------------------------------- sm100 weight_grad host rules

// The dense side by TMA wherever every row a 64-row box may reach is written and finite; by the
// cp.async producers where rows past offsets[E] may be unwritten or there are no rows at all.
TEST(WeightGradSm100Host, auto_reads_the_dense_side_by_tma_unless_rows_past_the_end_may_be_unwritten) {
  using sonicmoe::sm100::WeightGradConfig;
  using sonicmoe::sm100::choose_weight_grad_config;
  for (int64_t m_total : {1, 64, 4096 * 8}) {
    EXPECT_EQ(choose_weight_grad_config(false, false, m_total), WeightGradConfig::k1Sm128x256x64) << m_total;
    EXPECT_EQ(choose_weight_grad_config(false, true, m_total), WeightGradConfig::k1Sm128x256x64) << m_total;
    EXPECT_EQ(choose_weight_grad_config(true, true, m_total), WeightGradConfig::k1Sm128x256x64) << m_total;
    EXPECT_EQ(choose_weight_grad_config(true, false, m_total), WeightGradConfig::k1Sm128x256x64CpAsyncDense)
        << m_total;
  }
  for (bool partial : {false, true})
    for (bool zeroed : {false, true})
      EXPECT_EQ(choose_weight_grad_config(partial, zeroed, 0), WeightGradConfig::k1Sm128x256x64CpAsyncDense);
  EXPECT_STREQ(sonicmoe::sm100::weight_grad_config_name(WeightGradConfig::k1Sm128x256x64), "sm100_1sm_128x256x64");
  EXPECT_STREQ(sonicmoe::sm100::weight_grad_config_name(WeightGradConfig::k1Sm128x256x64CpAsyncDense),
               "sm100_1sm_128x256x64_cp_async_dense");
}

// K5 / K7's tile: one TMEM lane per row of the 128-wide gathered side, 256 dense columns (whole
// 64-column TMA boxes), two fp32 accumulators in TMEM's 512 columns, 4 stages in 227 KB.
TEST(WeightGradSm100Host, shape_fits_tmem_and_shared_memory) {
  for (auto config : {sonicmoe::sm100::WeightGradConfig::k1Sm128x256x64,
                      sonicmoe::sm100::WeightGradConfig::k1Sm128x256x64CpAsyncDense}) {
    const auto s = sonicmoe::sm100::weight_grad_shape(config);
    EXPECT_EQ(s.m, 128);
    EXPECT_EQ(s.n, 256);
    EXPECT_EQ(s.k, 64);
    EXPECT_EQ(s.n % 64, 0);
    EXPECT_LE(2 * s.n, 512);
    const int stage_bytes = (s.m + s.n) * s.k * 2;
    EXPECT_LE(s.stages * stage_bytes + 1024, 227 * 1024);
    EXPECT_GT((s.stages + 1) * stage_bytes, 227 * 1024);
  }
}

TEST(WeightGradSm100Host, takes_auto_only_and_names_the_rule) {
  sonicmoe::WeightGradParams p = sonicmoe::test::weight_grad_shape();
  for (bool gather_a : {true, false})
    for (bool partial : {false, true}) {
      p.gather_a = gather_a;
      p.partial_rows = partial;
      EXPECT_EQ(sonicmoe::check_weight_grad(p), "");
      EXPECT_EQ(sonicmoe::sm100::check_weight_grad(p), "");
    }
  p.gather_a = true;
  p.config = sonicmoe::GemmTileConfig::kVarlenCooperative128x256x64;  // valid on sm90 ...
  EXPECT_EQ(sonicmoe::check_weight_grad(p), "");
  EXPECT_EQ(sonicmoe::sm100::check_weight_grad(p),  // ... refused on sm100, naming the rule
            "weight_grad: config = 8 breaks the rule: must be 0 (auto) on an sm_100 GPU in this build (the other "
            "GemmTileConfigs are sm90 kernels); auto picks 1-SM 128x256x64 with the dense operand by TMA, or by "
            "cp.async where partial_rows is set without rows_past_end_zeroed or m_total is 0");
}

#if SONICMOE_HAS_SM100
// The workspace the torch layer allocates (grouped_gemm_workspace_size, the device not known)
// covers every sm100 kernel (K2, K6, K6 with the addend, each on both tiles): CUTLASS's part is
// host arithmetic, no GPU needed.
TEST(GroupedGemmSm100Host, workspace_covers_every_sm100_kernel) {
  using sonicmoe::WeightLayout;
  using sonicmoe::sm100::GemmConfig;
  using sonicmoe::sm100::grouped_gemm_cutlass_workspace_size;
  for (int experts : {1, 8, 128, 256}) {
    for (int sms : {1, 148}) {
      const size_t total = sonicmoe::grouped_gemm_workspace_size(experts, sms);
      for (size_t cutlass_bytes :
           {grouped_gemm_cutlass_workspace_size<GemmConfig::k1Sm128x256x64>(experts, sms),
            grouped_gemm_cutlass_workspace_size<GemmConfig::k2Sm256x256x64C2x1>(experts, sms),
            grouped_gemm_cutlass_workspace_size<GemmConfig::k1Sm128x256x64, WeightLayout::kKN>(experts, sms),
            grouped_gemm_cutlass_workspace_size<GemmConfig::k2Sm256x256x64C2x1, WeightLayout::kKN>(experts, sms),
            grouped_gemm_cutlass_workspace_size<GemmConfig::k1Sm128x256x64, WeightLayout::kKN, true>(experts, sms),
            grouped_gemm_cutlass_workspace_size<GemmConfig::k2Sm256x256x64C2x1, WeightLayout::kKN, true>(experts,
                                                                                                         sms)}) {
        EXPECT_GE(total, sonicmoe::grouped_gemm_workspace_layout(experts, cutlass_bytes).total)
            << experts << " experts, " << sms << " SMs";
      }
    }
  }
}
#endif

}  // namespace
