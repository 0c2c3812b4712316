// Host side of the backward through the down-projection and the gated activation (K4): rules, then
// the launch on the device's kernel family (sm90, or sm100 on a B200 where built).
#include <climits>
#include <cstdint>
#include <string>

#include "common/cuda_check.h"
#include "common/host_rules.h"
#include "common/tile_size.h"
#include "host/autotune.h"
#include "sm90/grouped_gemm_sm90.h"
#include "sm90/heuristics.h"
#include "sm100/grouped_gemm_sm100.h"
#include "sm100/heuristics.h"
#include "sonicmoe.h"

#if !defined(SONICMOE_HAS_SM90) || !defined(SONICMOE_HAS_SM100)
#error "SONICMOE_HAS_SM90 and SONICMOE_HAS_SM100 must be defined (CMakeLists.txt)"
#endif

namespace sonicmoe {
namespace {

Status launch_down_proj_grad(const DownProjGradParams& p, GemmTileConfig config) {
#if SONICMOE_HAS_SM90
  switch (config) {
    case GemmTileConfig::kVarlenPingpong128x128x64: return sm90::run_down_proj_grad(p);
    case GemmTileConfig::kVarlenCooperative128x256x64: return sm90::run_down_proj_grad_cooperative_128x256(p);
    case GemmTileConfig::kVarlenCooperative256x128x64: return sm90::run_down_proj_grad_cooperative_256x128(p);
    case GemmTileConfig::kVarlenCooperative128x256x64C2x1: return sm90::run_down_proj_grad_cooperative_128x256_c2x1(p);
    case GemmTileConfig::kVarlenPingpong128x128x64C2x1: return sm90::run_down_proj_grad_pingpong_128x128_c2x1(p);
    default:
      return Status::error("down_proj_grad: no kernel for tile config " + std::to_string(static_cast<int>(config)));
  }
#else
  (void)p, (void)config;
  return Status::error("down_proj_grad: this build holds no sm_90a kernels");  // device_kernel_arch refuses first
#endif
}

Status run_down_proj_grad_sm100(const DownProjGradParams& p) {
  const std::string problem = sm100::check_down_proj_grad(p);
  if (!problem.empty()) return Status::error(problem);
#if SONICMOE_HAS_SM100
  switch (sm100::choose_down_proj_grad_config(p.n, p.d)) {
    case sm100::DownProjGradConfig::k1Sm128x256x64:
      return sm100::run_down_proj_grad<sm100::DownProjGradConfig::k1Sm128x256x64>(p);
  }
  return Status::error("down_proj_grad: no sm100 kernel for this configuration");
#else
  return Status::error("down_proj_grad: this build holds no sm_100a kernels");  // device_kernel_arch refuses first
#endif
}

// The launch on the device's kernel family (the caller has made the launch device current).
Status launch_down_proj_grad_on_device(const DownProjGradParams& p) {
  int device = 0;
  SONICMOE_CUDA_TRY(cudaGetDevice(&device));
  const KernelArchChoice arch = device_kernel_arch("down_proj_grad", device);
  if (arch.arch == KernelArch::kSm100) return run_down_proj_grad_sm100(p);
  if (arch.arch != KernelArch::kSm90) return Status::error(arch.error);
  if (p.config != GemmTileConfig::kAuto) return launch_down_proj_grad(p, p.config);
  const autotune::Key key{autotune::Op::kDownProjGrad, p.n, p.d, autotune::bit_width(p.m_total), p.num_experts,
                          p.sm_count, int(p.partial_rows) | int(p.activation) << 1};
  return autotune::run(key, sm90::choose_down_proj_grad_config(p.n, p.d), autotune::varlen_candidates(), p.stream,
                       [&](GemmTileConfig config) { return launch_down_proj_grad(p, config); });
}

}  // namespace

// The rules sm100 adds to check_down_proj_grad's: its one kernel is chosen by rule
// (sm100/heuristics.h), and no GemmTileConfig names it.
std::string sm100::check_down_proj_grad(const DownProjGradParams& p) {
  return sm100_auto_config_only("down_proj_grad", p.config, sm100::kDownProjGradRule);
}

std::string check_down_proj_grad(const DownProjGradParams& p) {
  std::string problem = check_expert_mlp_dims("down_proj_grad", p);
  if (!problem.empty()) return problem;
  if (varlen_max_tiles(p.m_total, p.num_experts, 128, (p.n + 127) / 128) > INT32_MAX)
    return rule_message("down_proj_grad", "m_total", p.m_total,
                        "(m_total / 128 + num_experts) * ceil(n / 128) tiles must fit in int32");
  return {};
}

Status run_down_proj_grad(const DownProjGradParams& p) {
  std::string problem = check_down_proj_grad(p);
  if (!problem.empty()) return Status::error(problem);
  if (p.m_total == 0) return Status::success();
  if (p.d_out == nullptr || p.w2 == nullptr || p.h == nullptr || p.row_score == nullptr ||
      p.expert_offsets == nullptr || p.gather_idx == nullptr || p.d_h == nullptr ||
      p.a_scaled == nullptr || p.d_score_partial == nullptr)
    return Status::error("down_proj_grad: every pointer must be non-null");
  if (!aligned16(p.d_out) || !aligned16(p.w2) || !aligned16(p.h) || !aligned16(p.d_h) ||
      !aligned16(p.a_scaled))
    return Status::error("down_proj_grad: d_out, w2, h, d_h and a_scaled must be 16-byte aligned");
  const Status status = launch_down_proj_grad_on_device(p);
  if (!status.ok() || !p.partial_rows) return status;
  // The weight gradients read d_h and a_scaled by TMA boxes that may reach past offsets[E].
  const int32_t* end_row = p.expert_offsets + p.num_experts;
  constexpr int64_t kBf16Bytes = 2;
  return run_zero_rows_past_end(end_row, p.m_total, kRowsZeroedPastEnd,
                                {{p.d_h, 2 * p.n * kBf16Bytes}, {p.a_scaled, p.n * kBf16Bytes}}, p.stream);
}

}  // namespace sonicmoe
