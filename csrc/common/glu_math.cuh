// The gated activations' math, shared by every arch's K1 (A = act(gate) * up, forward) and K4
// (act and act' from H, backward) epilogues: only the register plumbing around it is per arch.
// fp32 in, fp32 out.
#pragma once

#include <cuda_runtime.h>

#include "sonicmoe.h"

namespace sonicmoe {

// tanh by one MUFU.TANH (max relative error ~2^-11, below the bf16 rounding of every result it
// feeds). tanh saturates to +-1.
__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// GeGLU's GELU is the tanh form (torch.nn.functional.gelu(approximate="tanh"), the GELU of the
// GeGLU models): gelu(x) = x/2 (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).
constexpr float kGeluC0 = 0.7978845608028654f;             // sqrt(2 / pi)
constexpr float kGeluC1 = 0.7978845608028654f * 0.044715f;  // sqrt(2 / pi) * 0.044715

// act(x).
template <GluActivation kAct>
__device__ __forceinline__ float glu_act(float x) {
  if constexpr (kAct == GluActivation::kSwiGLU) {
    // silu(x) = x sigmoid(x) = h + h tanh(h), h = x / 2: one MUFU where exp and a reciprocal
    // took two; the epilogues do not overlap the MMAs (K4 1-7% faster for it on its cooperative
    // tiles, H200). Exactly 0 for large negative x (tanh saturates).
    const float half = 0.5f * x;
    return fmaf(half, tanh_approx(half), half);
  } else if constexpr (kAct == GluActivation::kGeGLU) {
    const float half = 0.5f * x;
    return fmaf(half, tanh_approx(x * fmaf(kGeluC1, x * x, kGeluC0)), half);
  } else {
    return fmaxf(x, 0.0f);
  }
}

// act(x) and act'(x), from one tanh where there is one.
template <GluActivation kAct>
__device__ __forceinline__ void glu_act_grad(float x, float& act, float& d_act) {
  if constexpr (kAct == GluActivation::kSwiGLU) {
    // sig = (1 + t) / 2, silu = h + h t, silu' = sig + silu (1 - sig), t = tanh(x / 2), by FMAs.
    const float half = 0.5f * x;
    const float t = tanh_approx(half);
    const float sig = fmaf(0.5f, t, 0.5f);
    act = fmaf(half, t, half);
    d_act = fmaf(act, fmaf(-0.5f, t, 0.5f), sig);
  } else if constexpr (kAct == GluActivation::kGeGLU) {
    // gelu' = (1 + t) / 2 + x/2 (1 - t^2) du/dx, du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2).
    const float half = 0.5f * x;
    const float x2 = x * x;
    const float t = tanh_approx(x * fmaf(kGeluC1, x2, kGeluC0));
    act = fmaf(half, t, half);
    d_act = fmaf(half * fmaf(-t, t, 1.0f), fmaf(3.0f * kGeluC1, x2, kGeluC0), fmaf(0.5f, t, 0.5f));
  } else {
    act = fmaxf(x, 0.0f);
    d_act = x > 0.0f ? 1.0f : 0.0f;
  }
}

// K4's math for one column of one row (every arch's K4 epilogue): from H's gate and up, dA' (the
// accumulator) and the row's score s: dH's gate and up, A' = s * A, and the row's dS term dA' * A
// added to d_score.
//   A = act(gate) * up, dA = s * dA', dH = [dA * up * act'(gate), dA * act(gate)]
template <GluActivation kAct>
__device__ __forceinline__ void dglu_column(float gate, float up, float d_a_prime, float score, float& d_gate,
                                            float& d_up, float& a_scaled, float& d_score) {
  float act, d_act;
  glu_act_grad<kAct>(gate, act, d_act);
  const float a = act * up;
  d_score = fmaf(d_a_prime, a, d_score);
  const float d_a = score * d_a_prime;
  d_gate = d_a * up * d_act;
  d_up = d_a * act;
  a_scaled = score * a;
}

}  // namespace sonicmoe
