// K5 / K7: expert weight gradients as varlen-K grouped GEMMs, the gather along K fused into the
// cp.async loads of either operand, the other operand by TMA (or by cp.async where rows past
// offsets[E] were never written: partial_rows); both MN-major; ping-pong 128x128x64, sm90a.
#include "sm90/grouped_gemm_sm90.h"
#include "sm90/varlen_gemm_launch_sm90.cuh"
// After the launch header: it needs cudaTypedefs.h's driver typedefs before any CUTLASS include.
#include "sm90/collective/varlen_k_mainloop_sm90.cuh"

namespace sonicmoe::sm90 {
namespace {

template <bool kGatherA, bool kTmaDense>
Status run(const WeightGradParams& p) {
  using Mainloop =
      VarlenKMainloop<kVarlenTileM, kVarlenTileN, kVarlenTileK, kVarlenStages, kGatherA, kTmaDense>;
  using Kernel = VarlenGemmKernel<Mainloop, StoreEpilogue<kVarlenTileM, kVarlenTileN>,
                                  VarlenKTileScheduler<kVarlenTileM>>;
  using Element = cutlass::bfloat16_t;
  typename Kernel::Params params{};
  if constexpr (kTmaDense) {
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
  params.m_out = static_cast<int>(p.m_out);
  return launch_varlen_k_gemm<Kernel>(params, p.expert_offsets, p.m_total, p.num_experts, p.sm_count,
                                      p.stream, p.partial_rows);
}

}  // namespace

Status run_weight_grad(const WeightGradParams& p) {
  // No rows at all: nothing is read (every tile stores zeros), and TMA cannot describe an
  // empty tensor; partial_rows: rows past offsets[E] were never written, so no whole-box loads.
  if (p.partial_rows || p.m_total == 0) return p.gather_a ? run<true, false>(p) : run<false, false>(p);
  return p.gather_a ? run<true, true>(p) : run<false, true>(p);
}

}  // namespace sonicmoe::sm90
