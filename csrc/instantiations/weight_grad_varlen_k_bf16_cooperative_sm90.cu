// K5 / K7 on cooperative tiles: the gathered operand 128 wide (cp.async), the other 256 wide by
// TMA, so a gathered row chunk serves twice the FLOPs of a ping-pong tile: K5 (A = dO gathered)
// on 128x256x64, K7 (B = x gathered) on 256x128x64; 4 stages of 48 KB; sm90a. The 256-wide side
// has no cp.async path: with partial_rows its rows up to a box past offsets[E] must be finite
// (down_proj_grad zeroes kRowsZeroedPastEnd of them).
#include "sm90/grouped_gemm_sm90.h"
#include "sm90/weight_grad_launch_sm90.cuh"

namespace sonicmoe::sm90 {

static_assert(kVarlenTileK <= kRowsZeroedPastEnd, "a TMA box reaches at most kVarlenTileK - 1 rows past the end");

Status run_weight_grad_cooperative(const WeightGradParams& p) {
  if (p.gather_a)
    return run_weight_grad_with<VarlenKMainloop<128, 256, kVarlenTileK, kVarlenCooperativeStages,
                                                /*gather_a=*/true, /*tma_dense=*/true, /*consumers=*/2>>(p);
  // K7 in K5's shape: dW1[e]^T = x[gather]^T dH, x gathered on the 128-wide A side (the 256 x 128
  // tile with two 64-row atoms per warpgroup ran 0.64-0.82x the gathered copy + torch._grouped_mm),
  // stored transposed into (E, m_out, n_out).
  WeightGradParams t = p;
  t.a = p.b;
  t.b = p.a;
  t.m_out = p.n_out;
  t.n_out = p.m_out;
  t.gather_a = true;
  return run_weight_grad_with<VarlenKMainloop<128, 256, kVarlenTileK, kVarlenCooperativeStages,
                                              /*gather_a=*/true, /*tma_dense=*/true, /*consumers=*/2>,
                              /*transposed_out=*/true>(t);
}

}  // namespace sonicmoe::sm90
