// K5 / K7: expert weight gradients as varlen-K grouped GEMMs, the gather along K fused into the
// cp.async loads of either operand, the other operand by TMA (or by cp.async where rows past
// offsets[E] were never written: partial_rows); both MN-major; ping-pong 128x128x64, sm90a.
#include "sm90/grouped_gemm_sm90.h"
#include "sm90/weight_grad_launch_sm90.cuh"

namespace sonicmoe::sm90 {

template <bool kGatherA, bool kTmaDense>
using PingpongWeightGradMainloop =
    VarlenKMainloop<kVarlenTileM, kVarlenTileN, kVarlenTileK, kVarlenStages, kGatherA, kTmaDense>;

Status run_weight_grad(const WeightGradParams& p) {
  // No rows at all: nothing is read (every tile stores zeros), and TMA cannot describe an
  // empty tensor; partial_rows: rows past offsets[E] were never written, so no whole-box loads.
  if (p.partial_rows || p.m_total == 0)
    return p.gather_a ? run_weight_grad_with<PingpongWeightGradMainloop<true, false>>(p)
                      : run_weight_grad_with<PingpongWeightGradMainloop<false, false>>(p);
  return p.gather_a ? run_weight_grad_with<PingpongWeightGradMainloop<true, true>>(p)
                    : run_weight_grad_with<PingpongWeightGradMainloop<false, true>>(p);
}

}  // namespace sonicmoe::sm90
