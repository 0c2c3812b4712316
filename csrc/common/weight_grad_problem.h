// K7 (dW1 = dH^T x[gather]) as its transposed problem, dW1[e]^T = x[gather]^T dH: the gathered x
// becomes a, so the weight-gradient kernels that gather a (sm90's cooperative tiles, sm100's) run
// it; their output is then (E, n_out, m_out) of the transposed problem, stored transposed.
#pragma once

#include "sonicmoe.h"

namespace sonicmoe {

inline WeightGradParams transposed_weight_grad(const WeightGradParams& p) {
  WeightGradParams t = p;
  t.a = p.b;
  t.b = p.a;
  t.m_out = p.n_out;
  t.n_out = p.m_out;
  t.gather_a = !p.gather_a;
  return t;
}

}  // namespace sonicmoe
