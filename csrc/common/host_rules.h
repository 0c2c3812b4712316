// Message and pointer helpers of the kernel library's host-side rules (check_* in sonicmoe.h).
#pragma once

#include <cuda_runtime_api.h>

#include <climits>
#include <cstdint>
#include <string>

#include "sonicmoe.h"

namespace sonicmoe {

// "op: name = value breaks the rule: rule" (the torch layer uses the same wording).
inline std::string rule_message(const char* op, const char* name, int64_t value, const std::string& rule) {
  return std::string(op) + ": " + name + " = " + std::to_string(value) + " breaks the rule: " + rule;
}

// An sm100 op's kernels are chosen by rule (sm100/heuristics.h: `rule` says how) and no
// GemmTileConfig names them: on an sm_100 GPU config must be auto.
inline std::string sm100_auto_config_only(const char* op, GemmTileConfig config, const char* rule) {
  if (config == GemmTileConfig::kAuto) return {};
  return rule_message(op, "config", static_cast<int>(config),
                      std::string("must be 0 (auto) on an sm_100 GPU in this build (the other GemmTileConfigs "
                                  "are sm90 kernels); ") + rule);
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The varlen configurations every varlen op takes are the numbers from the first one to
// kLastVarlenConfig, and grouped_gemm's own ones (K2's and K6's) follow them to the last
// GemmTileConfig; the rules' messages name these ranges, so a new configuration extends them by
// itself.
constexpr int kFirstVarlenConfig = static_cast<int>(GemmTileConfig::kVarlenPingpong128x128x64);
constexpr int kLastVarlenConfig = static_cast<int>(GemmTileConfig::kVarlenPingpong128x128x64C2x1);
constexpr bool varlen_configs_are_the_last() {
  for (int c = 1; c < kNumGemmTileConfigs; ++c) {
    const auto config = static_cast<GemmTileConfig>(c);
    if (is_varlen_config(config) != (c >= kFirstVarlenConfig && c <= kLastVarlenConfig)) return false;
    if (is_grouped_gemm_only_config(config) != (c > kLastVarlenConfig)) return false;
  }
  return true;
}
static_assert(varlen_configs_are_the_last(),
              "the varlen configurations must be the last GemmTileConfigs, grouped_gemm's own ones after the rest");

// "7 to 11" (the range of varlen configurations every varlen op takes, for the rules' messages).
inline std::string varlen_config_range() {
  return std::to_string(kFirstVarlenConfig) + " to " + std::to_string(kLastVarlenConfig);
}

// "7 to 12": grouped_gemm's varlen configurations, every varlen op's and its own.
inline std::string grouped_gemm_varlen_config_range() {
  return std::to_string(kFirstVarlenConfig) + " to " + std::to_string(kNumGemmTileConfigs - 1);
}

// The rules every expert-MLP kernel shares (K1, K4: params with num_experts, num_tokens,
// m_total, d, n, sm_count, activation, config: the varlen kernel's); "" when they hold. d and n
// are 16-byte rows: cp.async chunks, TMA boxes, vector stores.
// (Comparisons in parentheses: g++ 12 reads `p.x < 0 || p.x > y` on a dependent p as a template
// argument list and warns.)
template <class Params>
std::string check_expert_mlp_dims(const char* op, const Params& p) {
  if (p.num_experts < 1) return rule_message(op, "num_experts", p.num_experts, "must be >= 1");
  if ((p.num_tokens < 0) || (p.num_tokens > INT32_MAX))
    return rule_message(op, "num_tokens", p.num_tokens, "must be in [0, 2^31 - 1]");
  if ((p.m_total < 0) || (p.m_total > INT32_MAX))
    return rule_message(op, "m_total", p.m_total, "must be in [0, 2^31 - 1]");
  if ((p.d < 8) || (p.d % 8 != 0) || (p.d > INT32_MAX))
    return rule_message(op, "d", p.d, "must be a positive multiple of 8 (16-byte rows)");
  if ((p.n < 8) || (p.n % 8 != 0) || (2 * p.n > INT32_MAX))
    return rule_message(op, "n", p.n, "must be a positive multiple of 8 (16-byte rows)");
  if (p.sm_count < 1) return rule_message(op, "sm_count", p.sm_count, "must be >= 1");
  const int activation = static_cast<int>(p.activation);
  if ((activation < 0) || (activation >= kNumGluActivations))
    return rule_message(op, "activation", activation, "must name a GluActivation (0 SwiGLU, 1 GeGLU, 2 ReGLU)");
  if (p.config != GemmTileConfig::kAuto && !is_varlen_config(p.config))
    return rule_message(op, "config", static_cast<int>(p.config),
                        ("must be 0 (auto) or a varlen configuration (" + varlen_config_range() + ")").c_str());
  return {};
}

}  // namespace sonicmoe
