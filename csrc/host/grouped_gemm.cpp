// Host side of the grouped GEMM: shape rules, workspace sizing, config choice and dispatch.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "common/grouped_gemm_workspace.h"
#include "common/tile_size.h"
#include "sm90/grouped_gemm_sm90.h"
#include "sm90/heuristics.h"
#include "sm100/grouped_gemm_sm100.h"
#include "sm100/heuristics.h"
#include "common/host_rules.h"
#include "common/cuda_check.h"
#include "host/autotune.h"
#include "sonicmoe.h"

// CMakeLists.txt sets both from SONICMOE_CUDA_ARCHS; a kernel family not built has no symbols to
// call, so its dispatch is compiled out.
#if !defined(SONICMOE_HAS_SM90) || !defined(SONICMOE_HAS_SM100)
#error "SONICMOE_HAS_SM90 and SONICMOE_HAS_SM100 must be defined (CMakeLists.txt)"
#endif

namespace sonicmoe {
namespace {

std::string value_rule(const char* name, int64_t value, const std::string& rule) {
  return rule_message("grouped_gemm", name, value, rule);
}

// Pointer rules, checked at launch (the shape rules of check_grouped_gemm need no data).
std::string check_grouped_gemm_pointers(const GroupedGemmParams& p) {
  if (p.a == nullptr || p.b == nullptr || p.out == nullptr || p.expert_offsets == nullptr ||
      p.workspace == nullptr)
    return "grouped_gemm: a, b, out, expert_offsets and workspace must be non-null";
  if (!aligned16(p.a) || !aligned16(p.b) || !aligned16(p.out))
    return "grouped_gemm: a, b and out must be 16-byte aligned (TMA)";
  if (p.b_layout != WeightLayout::kKN && (p.addend_scale != nullptr || p.addend_rows != nullptr))
    return "grouped_gemm: addend_scale / addend_rows run with b_layout KN (K6) only";
  if ((p.addend_scale == nullptr) != (p.addend_rows == nullptr))
    return "grouped_gemm: addend_scale and addend_rows come together (both or neither)";
  if (p.addend_rows != nullptr && !aligned16(p.addend_rows))
    return "grouped_gemm: addend_rows must be 16-byte aligned (16-byte copies)";
  if (p.addend_scale != nullptr && reinterpret_cast<uintptr_t>(p.addend_scale) % 4 != 0)
    return "grouped_gemm: addend_scale must be 4-byte aligned";
  return {};
}

#if SONICMOE_HAS_SM90
template <GemmTileConfig... Configs>
size_t max_cutlass_workspace(GemmTileConfigList<Configs...>, int num_experts, int sm_count) {
  size_t bytes = 0;
  ((bytes = std::max(bytes, sm90::grouped_gemm_cutlass_workspace_size<Configs>(num_experts, sm_count))), ...);
  return bytes;
}

template <GemmTileConfig... Configs>
Status dispatch(GemmTileConfigList<Configs...>, GemmTileConfig config, const GroupedGemmParams& p) {
  Status status = Status::error("grouped_gemm: no kernel for tile config " +
                                std::to_string(static_cast<int>(config)));
  ((config == Configs && ((status = sm90::run_grouped_gemm<Configs>(p)), true)) || ...);
  return status;
}

// K6 (b read N-major): each varlen configuration, without and with the addend (RowAddendStoreEpilogue).
Status launch_kn(const GroupedGemmParams& params, GemmTileConfig config) {
  using Run = Status (*)(const GroupedGemmParams&);
  Run plain = sm90::run_varlen_grouped_gemm_kn, addend = sm90::run_varlen_grouped_gemm_kn_addend;  // ping-pong
  switch (config) {
    case GemmTileConfig::kVarlenPingpong128x128x64: break;
    case GemmTileConfig::kVarlenCooperative128x256x64:
      plain = sm90::run_varlen_grouped_gemm_kn_cooperative_128x256;
      addend = sm90::run_varlen_grouped_gemm_kn_addend_cooperative_128x256;
      break;
    case GemmTileConfig::kVarlenCooperative256x128x64:
      plain = sm90::run_varlen_grouped_gemm_kn_cooperative_256x128;
      addend = sm90::run_varlen_grouped_gemm_kn_addend_cooperative_256x128;
      break;
    case GemmTileConfig::kVarlenCooperative128x256x64C2x1:
      plain = sm90::run_varlen_grouped_gemm_kn_cooperative_128x256_c2x1;
      addend = sm90::run_varlen_grouped_gemm_kn_addend_cooperative_128x256_c2x1;
      break;
    case GemmTileConfig::kVarlenPingpong128x128x64C2x1:
      plain = sm90::run_varlen_grouped_gemm_kn_pingpong_128x128_c2x1;
      addend = sm90::run_varlen_grouped_gemm_kn_addend_pingpong_128x128_c2x1;
      break;
    case GemmTileConfig::kVarlenPingpong128x192x64:
      plain = sm90::run_varlen_grouped_gemm_kn_pingpong_128x192;
      addend = sm90::run_varlen_grouped_gemm_kn_addend_pingpong_128x192;
      break;
    default:
      return Status::error("grouped_gemm: no KN kernel for tile config " + std::to_string(static_cast<int>(config)));
  }
  return (params.addend_rows != nullptr ? addend : plain)(params);
}

Status launch_nk(const GroupedGemmParams& params, GemmTileConfig config) {
  switch (config) {
    case GemmTileConfig::kVarlenPingpong128x128x64: return sm90::run_varlen_grouped_gemm(params);
    case GemmTileConfig::kVarlenCooperative128x256x64:
      return sm90::run_varlen_grouped_gemm_cooperative_128x256(params);
    case GemmTileConfig::kVarlenCooperative256x128x64:
      return sm90::run_varlen_grouped_gemm_cooperative_256x128(params);
    case GemmTileConfig::kVarlenCooperative128x256x64C2x1:
      return sm90::run_varlen_grouped_gemm_cooperative_128x256_c2x1(params);
    case GemmTileConfig::kVarlenPingpong128x128x64C2x1:
      return sm90::run_varlen_grouped_gemm_pingpong_128x128_c2x1(params);
    case GemmTileConfig::kVarlenPingpong128x192x64: return sm90::run_varlen_grouped_gemm_pingpong_128x192(params);
    default: return dispatch(PtrArrayGemmTileConfigs{}, config, params);
  }
}

// The varlen configurations every varlen op takes and grouped_gemm's own varlen one: K6's
// candidates.
const std::vector<GemmTileConfig>& varlen_grouped_gemm_candidates() {
  static const std::vector<GemmTileConfig> c = [] {
    std::vector<GemmTileConfig> v = autotune::varlen_candidates();
    v.push_back(GemmTileConfig::kVarlenPingpong128x192x64);
    return v;
  }();
  return c;
}

template <GemmTileConfig... Configs>
std::vector<GemmTileConfig> with_ptr_array(GemmTileConfigList<Configs...>) {
  std::vector<GemmTileConfig> c = varlen_grouped_gemm_candidates();
  (c.push_back(Configs), ...);
  return c;
}

// K2's candidates: the varlen configurations, grouped_gemm's own varlen one and CUTLASS's
// ptr-array ones.
const std::vector<GemmTileConfig>& all_candidates() {
  static const std::vector<GemmTileConfig> c = with_ptr_array(PtrArrayGemmTileConfigs{});
  return c;
}

Status run_grouped_gemm_sm90(const GroupedGemmParams& params) {
  if (params.b_layout == WeightLayout::kKN) {
    if (params.config != GemmTileConfig::kAuto) return launch_kn(params, params.config);
    const autotune::Key key{autotune::Op::kGroupedGemmKN, params.n_out, params.k, autotune::bit_width(params.m_total),
                            params.num_experts, params.sm_count,
                            int(params.partial_rows) | int(params.addend_rows != nullptr) << 1};
    const GemmTileConfig rule =
        sm90::choose_grouped_gemm_kn_config(params.m_total, params.n_out, params.k, params.num_experts);
    return autotune::run(key, rule, varlen_grouped_gemm_candidates(), params.stream,
                         [&](GemmTileConfig config) { return launch_kn(params, config); });
  }
  if (params.config != GemmTileConfig::kAuto) return launch_nk(params, params.config);
  // Token rounding's buffers (partial_rows) run on the varlen kernels only (check_grouped_gemm);
  // the rule keeps them on ping-pong.
  const GemmTileConfig rule =
      params.partial_rows ? GemmTileConfig::kVarlenPingpong128x128x64
                          : choose_grouped_gemm_config(params.m_total, params.n_out, params.k, params.num_experts);
  const autotune::Key key{autotune::Op::kGroupedGemm, params.n_out, params.k, autotune::bit_width(params.m_total),
                          params.num_experts, params.sm_count, int(params.partial_rows)};
  return autotune::run(key, rule, params.partial_rows ? autotune::varlen_candidates() : all_candidates(),
                       params.stream, [&](GemmTileConfig config) { return launch_nk(params, config); });
}
#endif  // SONICMOE_HAS_SM90

#if SONICMOE_HAS_SM100
// Every sm100 kernel of a configuration: K2, K6, K6 with the addend.
template <sm100::GemmConfig Config>
size_t sm100_cutlass_workspace(int num_experts, int sm_count) {
  return std::max({sm100::grouped_gemm_cutlass_workspace_size<Config>(num_experts, sm_count),
                   sm100::grouped_gemm_cutlass_workspace_size<Config, WeightLayout::kKN>(num_experts, sm_count),
                   sm100::grouped_gemm_cutlass_workspace_size<Config, WeightLayout::kKN, true>(num_experts, sm_count)});
}

size_t sm100_cutlass_workspace(int num_experts, int sm_count) {
  return std::max(sm100_cutlass_workspace<sm100::GemmConfig::k1Sm128x256x64>(num_experts, sm_count),
                  sm100_cutlass_workspace<sm100::GemmConfig::k2Sm256x256x64C2x1>(num_experts, sm_count));
}

template <sm100::GemmConfig Config>
Status run_sm100_kernel(const GroupedGemmParams& params) {
  if (params.b_layout == WeightLayout::kNK) return sm100::run_grouped_gemm<Config>(params);
  if (params.addend_rows != nullptr) return sm100::run_grouped_gemm<Config, WeightLayout::kKN, true>(params);
  return sm100::run_grouped_gemm<Config, WeightLayout::kKN>(params);
}
#endif

Status run_grouped_gemm_sm100(const GroupedGemmParams& params) {
  std::string problem = sm100::check_grouped_gemm(params);
  if (!problem.empty()) return Status::error(problem);
#if SONICMOE_HAS_SM100
  switch (sm100::choose_grouped_gemm_config(params.m_total, params.n_out, params.k, params.num_experts)) {
    case sm100::GemmConfig::k2Sm256x256x64C2x1:
      return run_sm100_kernel<sm100::GemmConfig::k2Sm256x256x64C2x1>(params);
    case sm100::GemmConfig::k1Sm128x256x64: break;
  }
  return run_sm100_kernel<sm100::GemmConfig::k1Sm128x256x64>(params);
#else
  return Status::error("grouped_gemm: this build holds no sm_100a kernels");  // device_kernel_arch refuses first
#endif
}

}  // namespace

// The rules sm100 adds to check_grouped_gemm's (either b_layout; KN's addend runs there, fused in
// the epilogue): its kernels are CUTLASS's ptr-array grouped GEMM, chosen by rule, and no
// GemmTileConfig names them.
std::string sm100::check_grouped_gemm(const GroupedGemmParams& p) {
  return sm100_auto_config_only("grouped_gemm", p.config, sm100::kGroupedGemmRule);
}

std::string check_grouped_gemm(const GroupedGemmParams& p) {
  if (p.num_experts < 1) return value_rule("num_experts", p.num_experts, "must be >= 1");
  if (p.m_total < 0 || p.m_total > INT32_MAX)
    return value_rule("m_total", p.m_total, "must be in [0, 2^31 - 1]");
  // TMA moves whole 16-byte rows: 8 bf16 elements.
  if (p.k < 8 || p.k % 8 != 0 || p.k > INT32_MAX)
    return value_rule("k", p.k, "must be a positive multiple of 8 (16-byte rows for TMA)");
  if (p.n_out < 8 || p.n_out % 8 != 0 || p.n_out > INT32_MAX)
    return value_rule("n_out", p.n_out, "must be a positive multiple of 8 (16-byte rows for TMA)");
  if (p.sm_count < 1) return value_rule("sm_count", p.sm_count, "must be >= 1");
  const int config = static_cast<int>(p.config);
  if (config < 0 || config >= kNumGemmTileConfigs)
    return value_rule("config", config, "must name a GemmTileConfig");
  const int layout = static_cast<int>(p.b_layout);
  if (layout < 0 || layout > 1) return value_rule("b_layout", layout, "must name a WeightLayout (0 NK, 1 KN)");
  // grouped_gemm's varlen configurations: every varlen op's and its own (kFirstVarlenConfig to the last).
  const bool varlen = is_varlen_config(p.config) || is_grouped_gemm_only_config(p.config);
  if (p.b_layout == WeightLayout::kKN && p.config != GemmTileConfig::kAuto && !varlen)
    return value_rule("config", config,
                      ("b_layout KN (b is (E, k, n_out)) runs on the varlen kernels only: use 0 (auto) or " +
                       grouped_gemm_varlen_config_range()).c_str());
  if (p.partial_rows && p.config != GemmTileConfig::kAuto && !varlen)
    return value_rule("config", config,
                      ("partial_rows runs on the varlen kernels only: use 0 (auto) or " +
                       grouped_gemm_varlen_config_range()).c_str());
  const int64_t n_blocks = (p.n_out + 127) / 128;
  if (varlen_max_tiles(p.m_total, p.num_experts, 64, n_blocks) > INT32_MAX)
    return value_rule("m_total", p.m_total,
                      "(m_total / 64 + num_experts) * ceil(n_out / 128) tiles must fit in int32");
  return {};
}

// The most any kernel family built may need: the device is not known here.
size_t grouped_gemm_workspace_size(int num_experts, int sm_count) {
  size_t cutlass_bytes = 0;
#if SONICMOE_HAS_SM90
  cutlass_bytes = std::max(cutlass_bytes, max_cutlass_workspace(PtrArrayGemmTileConfigs{}, num_experts, sm_count));
#endif
#if SONICMOE_HAS_SM100
  cutlass_bytes = std::max(cutlass_bytes, sm100_cutlass_workspace(num_experts, sm_count));
#endif
  return grouped_gemm_workspace_layout(num_experts, cutlass_bytes).total;
}

GemmTileConfig choose_grouped_gemm_config(int64_t m_total, int64_t n_out, int64_t k,
                                          int num_experts) {
  return sm90::choose_grouped_gemm_config(m_total, n_out, k, num_experts);
}

Status run_grouped_gemm(const GroupedGemmParams& params) {
  std::string problem = check_grouped_gemm(params);
  if (!problem.empty()) return Status::error(problem);
  if (params.m_total == 0) return Status::success();  // nothing to compute, nothing to launch
  problem = check_grouped_gemm_pointers(params);
  if (!problem.empty()) return Status::error(problem);

  // The device's kernel family (the caller has made the launch device current).
  int device = 0;
  SONICMOE_CUDA_TRY(cudaGetDevice(&device));
  const bool nk = params.b_layout == WeightLayout::kNK;
  const KernelArchChoice arch =
      device_kernel_arch(nk ? "grouped_gemm" : "grouped_gemm (b_layout KN)", device);
  if (arch.arch == KernelArch::kSm100) return run_grouped_gemm_sm100(params);
  if (arch.arch != KernelArch::kSm90) return Status::error(arch.error);
#if SONICMOE_HAS_SM90
  return run_grouped_gemm_sm90(params);
#else
  return Status::error("grouped_gemm: this build holds no sm_90a kernels");  // device_kernel_arch refuses first
#endif
}

}  // namespace sonicmoe
