// K6 layout on the varlen kernel: out = a @ b[e] with b (E, k, n_out) read N-major by TMA (no
// weight transpose); contiguous A by TMA, masked row stores; ping-pong 128x128x64, sm90a.
#include "sm90/grouped_gemm_sm90.h"
#include "sm90/varlen_gemm_launch_sm90.cuh"

namespace sonicmoe::sm90 {

Status run_varlen_grouped_gemm_kn(const GroupedGemmParams& p) {
  using Mainloop = VarlenMainloop<kVarlenTileM, kVarlenTileN, kVarlenTileK, kVarlenStages,
                                  /*gather=*/false, /*k_major_b=*/false>;
  using Kernel = VarlenGemmKernel<Mainloop, StoreEpilogue<kVarlenTileM, kVarlenTileN>>;
  typename Kernel::Params params{};
  SONICMOE_TRY(make_rows_tensor_map<Mainloop>(&params.mainloop.tma_a, p.a, p.m_total, p.k));
  SONICMOE_TRY(make_weight_tensor_map<Mainloop>(&params.mainloop.tma_b, p.b, p.n_out, p.k, p.num_experts));
  params.mainloop.k = static_cast<int>(p.k);
  params.epilogue.out = static_cast<cutlass::bfloat16_t*>(p.out);
  params.epilogue.n_out = static_cast<int>(p.n_out);
  return launch_varlen_gemm<Kernel>(params, p.expert_offsets, p.m_total, p.num_experts, p.sm_count,
                                    p.stream, p.partial_rows);
}

}  // namespace sonicmoe::sm90
