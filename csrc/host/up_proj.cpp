// Host side of the up-projection (K1): shape and pointer rules, then the launch on the device's
// kernel family (sm90, or sm100 on a B200 where built).
#include <climits>
#include <cstdint>
#include <string>

#include "host/autotune.h"
#include "sm90/grouped_gemm_sm90.h"
#include "sm90/heuristics.h"
#include "sm100/grouped_gemm_sm100.h"
#include "sm100/heuristics.h"
#include "common/tile_size.h"
#include "common/cuda_check.h"
#include "common/host_rules.h"
#include "sonicmoe.h"

#if !defined(SONICMOE_HAS_SM90) || !defined(SONICMOE_HAS_SM100)
#error "SONICMOE_HAS_SM90 and SONICMOE_HAS_SM100 must be defined (CMakeLists.txt)"
#endif

namespace sonicmoe {

namespace {

Status launch_up_proj(const UpProjParams& p, GemmTileConfig config) {
#if SONICMOE_HAS_SM90
  switch (config) {
    case GemmTileConfig::kVarlenPingpong128x128x64: return sm90::run_up_proj(p);
    case GemmTileConfig::kVarlenCooperative128x256x64: return sm90::run_up_proj_cooperative_128x256(p);
    case GemmTileConfig::kVarlenCooperative256x128x64: return sm90::run_up_proj_cooperative_256x128(p);
    case GemmTileConfig::kVarlenCooperative128x256x64C2x1: return sm90::run_up_proj_cooperative_128x256_c2x1(p);
    case GemmTileConfig::kVarlenPingpong128x128x64C2x1: return sm90::run_up_proj_pingpong_128x128_c2x1(p);
    default: return Status::error("up_proj: no kernel for tile config " + std::to_string(static_cast<int>(config)));
  }
#else
  (void)p, (void)config;
  return Status::error("up_proj: this build holds no sm_90a kernels");  // device_kernel_arch refuses first
#endif
}

Status run_up_proj_sm100(const UpProjParams& p) {
  const std::string problem = sm100::check_up_proj(p);
  if (!problem.empty()) return Status::error(problem);
#if SONICMOE_HAS_SM100
  switch (sm100::choose_up_proj_config(p.n, p.d)) {
    case sm100::UpProjConfig::k1Sm128x256x64: return sm100::run_up_proj<sm100::UpProjConfig::k1Sm128x256x64>(p);
  }
  return Status::error("up_proj: no sm100 kernel for this configuration");
#else
  return Status::error("up_proj: this build holds no sm_100a kernels");  // device_kernel_arch refuses first
#endif
}

}  // namespace

// The rules sm100 adds to check_up_proj's: its one kernel is chosen by rule (sm100/heuristics.h),
// and no GemmTileConfig names it.
std::string sm100::check_up_proj(const UpProjParams& p) {
  return sm100_auto_config_only("up_proj", p.config, sm100::kUpProjRule);
}

std::string check_up_proj(const UpProjParams& p) {
  std::string problem = check_expert_mlp_dims("up_proj", p);
  if (!problem.empty()) return problem;
  if (varlen_max_tiles(p.m_total, p.num_experts, 128, (p.n + 63) / 64) > INT32_MAX)
    return rule_message("up_proj", "m_total", p.m_total,
                        "(m_total / 128 + num_experts) * ceil(n / 64) tiles must fit in int32");
  return {};
}

Status run_up_proj(const UpProjParams& p) {
  std::string problem = check_up_proj(p);
  if (!problem.empty()) return Status::error(problem);
  if (p.m_total == 0) return Status::success();
  if (p.x == nullptr || p.w1 == nullptr || p.expert_offsets == nullptr || p.gather_idx == nullptr ||
      p.a == nullptr)
    return Status::error("up_proj: x, w1, expert_offsets, gather_idx and a must be non-null");
  if (!aligned16(p.x) || !aligned16(p.w1) || !aligned16(p.a) || (p.h != nullptr && !aligned16(p.h)))
    return Status::error("up_proj: x, w1, h and a must be 16-byte aligned");
  // The device's kernel family (the caller has made the launch device current).
  int device = 0;
  SONICMOE_CUDA_TRY(cudaGetDevice(&device));
  const KernelArchChoice arch = device_kernel_arch("up_proj", device);
  if (arch.arch == KernelArch::kSm100) return run_up_proj_sm100(p);
  if (arch.arch != KernelArch::kSm90) return Status::error(arch.error);
  if (p.config != GemmTileConfig::kAuto) return launch_up_proj(p, p.config);
  const autotune::Key key{autotune::Op::kUpProj, p.n, p.d, autotune::bit_width(p.m_total), p.num_experts,
                          p.sm_count, int(p.partial_rows) | int(p.h != nullptr) << 1 | int(p.activation) << 2};
  return autotune::run(key, sm90::choose_up_proj_config(p.n, p.d), autotune::varlen_candidates(), p.stream,
                       [&](GemmTileConfig config) { return launch_up_proj(p, config); });
}

}  // namespace sonicmoe
