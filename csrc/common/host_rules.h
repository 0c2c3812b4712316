// Message and pointer helpers of the kernel library's host-side rules (check_* in sonicmoe.h).
#pragma once

#include <climits>
#include <cstdint>
#include <string>

#include "sonicmoe.h"

namespace sonicmoe {

// "op: name = value breaks the rule: rule" (the torch layer uses the same wording).
inline std::string rule_message(const char* op, const char* name, int64_t value, const char* rule) {
  return std::string(op) + ": " + name + " = " + std::to_string(value) + " breaks the rule: " + rule;
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The rules every expert-MLP kernel shares (K1, K4: params with num_experts, num_tokens,
// m_total, d, n, sm_count, config: the varlen kernel's); "" when they hold. d and n are 16-byte rows: cp.async chunks,
// TMA boxes, vector stores.
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
  if (p.config != GemmTileConfig::kAuto && !is_varlen_config(p.config))
    return rule_message(op, "config", static_cast<int>(p.config),
                        "must be 0 (auto) or a varlen configuration (7 to 10)");
  return {};
}

}  // namespace sonicmoe
