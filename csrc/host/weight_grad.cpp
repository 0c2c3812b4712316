// Host side of the expert weight gradients (K5, K7): rules, then the launch on the device's kernel
// family (sm90, or sm100 on a B200 where built).
#include <climits>
#include <cstdint>
#include <string>

#include "common/cuda_check.h"
#include "common/host_rules.h"
#include "common/tile_size.h"
#include "sm90/grouped_gemm_sm90.h"
#include "sm90/heuristics.h"
#include "sm100/grouped_gemm_sm100.h"
#include "sm100/heuristics.h"
#include "host/autotune.h"
#include "sonicmoe.h"

#if !defined(SONICMOE_HAS_SM90) || !defined(SONICMOE_HAS_SM100)
#error "SONICMOE_HAS_SM90 and SONICMOE_HAS_SM100 must be defined (CMakeLists.txt)"
#endif

namespace sonicmoe {
namespace {

// The tiles whose gathered side is 128 wide: 8 gathering A, 9 gathering B, 10 either, clustered.
bool cooperative_weight_grad(GemmTileConfig config) {
  return config == GemmTileConfig::kVarlenCooperative128x256x64 ||
         config == GemmTileConfig::kVarlenCooperative256x128x64 ||
         config == GemmTileConfig::kVarlenCooperative128x256x64C2x1;
}

}  // namespace

std::string check_weight_grad(const WeightGradParams& p) {
  auto rule = [](const char* name, int64_t value, const char* r) {
    return rule_message("weight_grad", name, value, r);
  };
  if (p.num_experts < 1) return rule("num_experts", p.num_experts, "must be >= 1");
  if (p.num_tokens < 0 || p.num_tokens > INT32_MAX)
    return rule("num_tokens", p.num_tokens, "must be in [0, 2^31 - 1]");
  if (p.m_total < 0 || p.m_total > INT32_MAX) return rule("m_total", p.m_total, "must be in [0, 2^31 - 1]");
  if (p.m_out < 8 || p.m_out % 8 != 0)
    return rule("m_out", p.m_out, "must be a positive multiple of 8 (16-byte rows)");
  if (p.n_out < 8 || p.n_out % 8 != 0)
    return rule("n_out", p.n_out, "must be a positive multiple of 8 (16-byte rows)");
  if (p.sm_count < 1) return rule("sm_count", p.sm_count, "must be >= 1");
  if (int64_t(p.num_experts) * p.m_out > INT32_MAX)
    return rule("m_out", p.m_out, "num_experts * m_out output rows must fit in int32");
  const int64_t tiles = int64_t(p.num_experts) * ((p.m_out + 127) / 128) * ((p.n_out + 127) / 128);
  if (tiles > INT32_MAX) return rule("n_out", p.n_out, "the output's 128 x 128 tiles must fit in int32");
  const bool cooperative = cooperative_weight_grad(p.config);
  if (!cooperative && p.config != GemmTileConfig::kAuto && p.config != GemmTileConfig::kVarlenPingpong128x128x64)
    return rule("config", static_cast<int>(p.config),
                "must be 0 (auto), 7 (varlen_pingpong_128x128x64), 8 (varlen_cooperative_128x256x64, "
                "gather_a), 9 (varlen_cooperative_256x128x64, gather_b) or 10 "
                "(varlen_cooperative_128x256x64_c2x1, either: 8 or 9 in 2 x 1 clusters)");
  if (cooperative && p.config != GemmTileConfig::kVarlenCooperative128x256x64C2x1 &&
      (p.config == GemmTileConfig::kVarlenCooperative128x256x64) != p.gather_a)
    return rule("config", static_cast<int>(p.config),
                p.gather_a ? "must not be 9 with gather_a: the gathered side of a cooperative tile is 128 wide "
                             "(8, varlen_cooperative_128x256x64)"
                           : "must not be 8 without gather_a: the gathered side of a cooperative tile is 128 "
                             "wide (9, varlen_cooperative_256x128x64)");
  return {};
}

namespace {

Status launch_weight_grad(const WeightGradParams& p, GemmTileConfig config) {
#if SONICMOE_HAS_SM90
  if (config == GemmTileConfig::kVarlenCooperative128x256x64C2x1 && p.m_total > 0)
    return sm90::run_weight_grad_cooperative_c2x1(p);
  if (cooperative_weight_grad(config) && p.m_total > 0) return sm90::run_weight_grad_cooperative(p);
  return sm90::run_weight_grad(p);
#else
  (void)p, (void)config;
  return Status::error("weight_grad: this build holds no sm_90a kernels");  // device_kernel_arch refuses first
#endif
}

Status run_weight_grad_sm100(const WeightGradParams& p) {
  const std::string problem = sm100::check_weight_grad(p);
  if (!problem.empty()) return Status::error(problem);
#if SONICMOE_HAS_SM100
  using sm100::WeightGradConfig;
  switch (sm100::choose_weight_grad_config(p.partial_rows, p.rows_past_end_zeroed, p.m_total)) {
    case WeightGradConfig::k1Sm128x256x64: return sm100::run_weight_grad<WeightGradConfig::k1Sm128x256x64>(p);
    case WeightGradConfig::k1Sm128x256x64CpAsyncDense:
      return sm100::run_weight_grad<WeightGradConfig::k1Sm128x256x64CpAsyncDense>(p);
  }
  return Status::error("weight_grad: no sm100 kernel for this configuration");
#else
  return Status::error("weight_grad: this build holds no sm_100a kernels");  // device_kernel_arch refuses first
#endif
}

}  // namespace

// The rules sm100 adds to check_weight_grad's: its kernels are chosen by rule (sm100/heuristics.h),
// and no GemmTileConfig names them.
std::string sm100::check_weight_grad(const WeightGradParams& p) {
  return sm100_auto_config_only("weight_grad", p.config, sm100::kWeightGradRule);
}

Status run_weight_grad(const WeightGradParams& p) {
  const std::string problem = check_weight_grad(p);
  if (!problem.empty()) return Status::error(problem);
  // Even with no rows at all every expert's gradient is written (zeros), so there is no early
  // return; a and b are never read for rows that do not exist.
  if (p.expert_offsets == nullptr || p.out == nullptr ||
      (p.m_total > 0 && (p.a == nullptr || p.b == nullptr || p.gather_idx == nullptr)))
    return Status::error("weight_grad: a, b, expert_offsets, gather_idx and out must be non-null");
  if (!aligned16(p.a) || !aligned16(p.b) || !aligned16(p.out))
    return Status::error("weight_grad: a, b and out must be 16-byte aligned");
  // The device's kernel family (the caller has made the launch device current).
  int device = 0;
  SONICMOE_CUDA_TRY(cudaGetDevice(&device));
  const KernelArchChoice arch = device_kernel_arch("weight_grad", device);
  if (arch.arch == KernelArch::kSm100) return run_weight_grad_sm100(p);
  if (arch.arch != KernelArch::kSm90) return Status::error(arch.error);
  // No rows at all: every tile stores zeros through the ping-pong kernel's cp.async path (TMA
  // cannot describe an empty tensor).
  const bool partial = p.partial_rows && !p.rows_past_end_zeroed;
  const GemmTileConfig rule =
      sm90::choose_weight_grad_config(p.gather_a, partial, p.m_total, p.num_experts, p.m_out, p.n_out);
  if (p.config != GemmTileConfig::kAuto) return launch_weight_grad(p, p.config);
  if (partial || p.m_total == 0) return launch_weight_grad(p, rule);  // ping-pong's cp.async path only
  static const std::vector<GemmTileConfig> gather_a_candidates{
      GemmTileConfig::kVarlenPingpong128x128x64, GemmTileConfig::kVarlenCooperative128x256x64,
      GemmTileConfig::kVarlenCooperative128x256x64C2x1};
  static const std::vector<GemmTileConfig> gather_b_candidates{
      GemmTileConfig::kVarlenPingpong128x128x64, GemmTileConfig::kVarlenCooperative256x128x64,
      GemmTileConfig::kVarlenCooperative128x256x64C2x1};
  const autotune::Key key{autotune::Op::kWeightGrad, p.n_out, p.m_out, autotune::bit_width(p.m_total),
                          p.num_experts, p.sm_count,
                          int(p.gather_a) | int(p.partial_rows) << 1 | int(p.rows_past_end_zeroed) << 2};
  return autotune::run(key, rule, p.gather_a ? gather_a_candidates : gather_b_candidates, p.stream,
                       [&](GemmTileConfig config) { return launch_weight_grad(p, config); });
}

}  // namespace sonicmoe
