// Host side of the backward through the down-projection and SwiGLU (K4): rules, then launch.
#include <climits>
#include <cstdint>
#include <string>

#include "common/host_rules.h"
#include "common/tile_size.h"
#include "sm90/grouped_gemm_sm90.h"
#include "sonicmoe.h"

namespace sonicmoe {
namespace {

std::string value_rule(const char* name, int64_t value, const char* rule) {
  return rule_message("down_proj_grad", name, value, rule);
}

}  // namespace

std::string check_down_proj_grad(const DownProjGradParams& p) {
  if (p.num_experts < 1) return value_rule("num_experts", p.num_experts, "must be >= 1");
  if (p.num_tokens < 0 || p.num_tokens > INT32_MAX)
    return value_rule("num_tokens", p.num_tokens, "must be in [0, 2^31 - 1]");
  if (p.m_total < 0 || p.m_total > INT32_MAX)
    return value_rule("m_total", p.m_total, "must be in [0, 2^31 - 1]");
  if (p.d < 8 || p.d % 8 != 0 || p.d > INT32_MAX)
    return value_rule("d", p.d, "must be a positive multiple of 8 (16-byte rows)");
  if (p.n < 8 || p.n % 8 != 0 || 2 * p.n > INT32_MAX)
    return value_rule("n", p.n, "must be a positive multiple of 8 (16-byte rows)");
  if (p.sm_count < 1) return value_rule("sm_count", p.sm_count, "must be >= 1");
  if (varlen_max_tiles(p.m_total, p.num_experts, 128, (p.n + 127) / 128) > INT32_MAX)
    return value_rule("m_total", p.m_total,
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
  return sm90::run_down_proj_grad(p);
}

}  // namespace sonicmoe
