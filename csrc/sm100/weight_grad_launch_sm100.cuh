// Host side of the sm100 varlen-K grouped GEMMs (K5, K7): the dense operand's TMA descriptor, the
// kernel's parameters, the launch on the varlen gathered kernel with the varlen-K scheduler.
#pragma once

#include "sm100/varlen_gemm_launch_sm100.cuh"
// After the launch header: it needs cudaTypedefs.h's driver typedefs before any CUTLASS include.
#include "sm100/collective/varlen_k_mainloop_sm100.cuh"
#include "sm100/epilogue/weight_grad_epilogue_sm100.cuh"
#include "common/weight_grad_problem.h"

namespace sonicmoe::sm100 {

// 4 stages of 48 KB (gathered 16 KB + dense 32 KB) are 192 KB of the 227 KB a CTA may use; a
// fifth does not fit.
template <WeightGradConfig kConfig>
using WeightGradMainloop =
    VarlenKMainloop<weight_grad_shape(kConfig).m, weight_grad_shape(kConfig).n, weight_grad_shape(kConfig).k,
                    weight_grad_shape(kConfig).stages, kConfig == WeightGradConfig::k1Sm128x256x64>;

// p describes the computed problem: a gathered (num_tokens, m_out), b dense (m_total, n_out); out
// (E, m_out, n_out), or (E, n_out, m_out) with kTransposedOut.
template <class Mainloop, bool kTransposedOut>
Status run_weight_grad_with(const WeightGradParams& p) {
  using Kernel = VarlenGatherGemmKernel<Mainloop, WeightGradEpilogue<Mainloop::kTileN, kTransposedOut>,
                                        VarlenKTileScheduler<Mainloop::kTileM>>;
  using Element = cutlass::bfloat16_t;
  typename Kernel::Params params{};
  if constexpr (Mainloop::kTmaDense) {
    SONICMOE_TRY(make_row_major_tensor_map(&params.mainloop.tma_b, p.b, p.m_total, p.n_out, Mainloop::kBoxCols,
                                           Mainloop::kTileK, "b"));
  }
  params.mainloop.gather_src = static_cast<const Element*>(p.a);
  params.mainloop.gather_idx = p.gather_idx;
  params.mainloop.gather_src_rows = static_cast<int>(p.num_tokens);
  params.mainloop.dense = static_cast<const Element*>(p.b);
  params.mainloop.m_out = params.epilogue.m_out = params.m_out = static_cast<int>(p.m_out);
  params.mainloop.n_out = params.epilogue.n_out = static_cast<int>(p.n_out);
  params.epilogue.out = static_cast<Element*>(p.out);
  return launch_varlen_gather<Kernel>(params, p);
}

// K5 (gather_a: dW2 = dO[gather]^T A') on the tile as it is; K7 as its transposed problem
// (common/weight_grad_problem.h), so its gathered x is the 128-wide side too.
template <WeightGradConfig kConfig>
Status run_weight_grad(const WeightGradParams& p) {
  using Mainloop = WeightGradMainloop<kConfig>;
  if (p.gather_a) return run_weight_grad_with<Mainloop, /*transposed_out=*/false>(p);
  return run_weight_grad_with<Mainloop, /*transposed_out=*/true>(transposed_weight_grad(p));
}

}  // namespace sonicmoe::sm100
