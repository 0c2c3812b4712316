// Host side of the sm90 varlen-K grouped GEMMs (K5, K7): one launch per mainloop configuration.
#pragma once

#include "sm90/varlen_gemm_launch_sm90.cuh"
// After the launch header: it needs cudaTypedefs.h's driver typedefs before any CUTLASS include.
#include "sm90/collective/varlen_k_mainloop_sm90.cuh"

namespace sonicmoe::sm90 {

// kTransposedOut: the kernel computes out[e]^T (K7 in K5's shape, TransposedStoreEpilogue); p
// then describes that transposed problem, its output written as (E, n_out, m_out).
template <class Mainloop, bool kTransposedOut = false>
Status run_weight_grad_with(const WeightGradParams& p) {
  // Staged stores: quad-transposed ones measured -1% to +3% here, no gain (docs/perf-notes.md, session 10).
  using Epilogue = cute::conditional_t<kTransposedOut, TransposedStoreEpilogue<Mainloop::kTileM, Mainloop::kTileN>,
                                       StoreEpilogue<Mainloop::kTileM, Mainloop::kTileN, TileStore::kStaged>>;
  using Kernel = VarlenGemmKernel<Mainloop, Epilogue, VarlenKTileScheduler<Mainloop::kTileM>>;
  using Element = cutlass::bfloat16_t;
  constexpr bool kGatherA = Mainloop::kGatherA;
  typename Kernel::Params params{};
  if constexpr (Mainloop::kTmaDense) {
    SONICMOE_TRY(make_row_major_tensor_map(&params.mainloop.tma_dense, kGatherA ? p.b : p.a, p.m_total,
                                           kGatherA ? p.n_out : p.m_out, Mainloop::kBoxCols,
                                           Mainloop::kBoxRows, kGatherA ? "b" : "a"));
  }
  params.mainloop.a = static_cast<const Element*>(p.a);
  params.mainloop.b = static_cast<const Element*>(p.b);
  params.mainloop.gather_idx = p.gather_idx;
  params.mainloop.gather_src_rows = static_cast<int>(p.num_tokens);
  params.mainloop.m_out = static_cast<int>(p.m_out);
  params.mainloop.n_out = static_cast<int>(p.n_out);
  params.epilogue.out = static_cast<Element*>(p.out);
  params.epilogue.n_out = static_cast<int>(p.n_out);
  if constexpr (kTransposedOut) params.epilogue.m_out = static_cast<int>(p.m_out);
  params.m_out = static_cast<int>(p.m_out);
  return launch_varlen_k_gemm<Kernel>(params, p.expert_offsets, p.m_total, p.num_experts, p.sm_count,
                                      p.stream, p.partial_rows);
}

}  // namespace sonicmoe::sm90
