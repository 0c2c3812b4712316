// Host side of the up-projection (K1): shape and pointer rules, then the sm90 launch.
#include <climits>
#include <cstdint>
#include <string>

#include "sm90/grouped_gemm_sm90.h"
#include "common/tile_size.h"
#include "common/host_rules.h"
#include "sonicmoe.h"

namespace sonicmoe {
namespace {

std::string value_rule(const char* name, int64_t value, const char* rule) {
  return rule_message("up_proj", name, value, rule);
}

}  // namespace

std::string check_up_proj(const UpProjParams& p) {
  if (p.num_experts < 1) return value_rule("num_experts", p.num_experts, "must be >= 1");
  if (p.num_tokens < 0 || p.num_tokens > INT32_MAX)
    return value_rule("num_tokens", p.num_tokens, "must be in [0, 2^31 - 1]");
  if (p.m_total < 0 || p.m_total > INT32_MAX)
    return value_rule("m_total", p.m_total, "must be in [0, 2^31 - 1]");
  // 16-byte rows: cp.async chunks of x, TMA boxes of w1, vector stores of H and A.
  if (p.d < 8 || p.d % 8 != 0 || p.d > INT32_MAX)
    return value_rule("d", p.d, "must be a positive multiple of 8 (16-byte rows)");
  if (p.n < 8 || p.n % 8 != 0 || 2 * p.n > INT32_MAX)
    return value_rule("n", p.n, "must be a positive multiple of 8 (16-byte rows)");
  if (p.sm_count < 1) return value_rule("sm_count", p.sm_count, "must be >= 1");
  if (varlen_max_tiles(p.m_total, p.num_experts, 128, (p.n + 63) / 64) > INT32_MAX)
    return value_rule("m_total", p.m_total,
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
  return sm90::run_up_proj(p);
}

}  // namespace sonicmoe
