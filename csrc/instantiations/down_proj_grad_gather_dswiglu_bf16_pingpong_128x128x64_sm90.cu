// K4: dA' = dO[gather] @ w2[e] with dO rows gathered by cp.async and w2 (E, d, n) read N-major
// by TMA; dSwiGLU / score-gradient epilogue reading H; ping-pong 128x128x64, sm90a.
#include "sm90/grouped_gemm_sm90.h"
#include "sm90/varlen_gemm_launch_sm90.cuh"

namespace sonicmoe::sm90 {

Status run_down_proj_grad(const DownProjGradParams& p) {
  using Mainloop = VarlenMainloop<kVarlenTileM, kVarlenTileN, kVarlenTileK, kVarlenStages,
                                  /*gather=*/true, /*k_major_b=*/false>;
  using Kernel = VarlenGemmKernel<Mainloop, DSwiGLUEpilogue<kVarlenTileM, kVarlenTileN>>;
  static_assert(kVarlenTileN == kDownProjGradBlockCols, "d_score_partial slots are N tiles");
  using Element = cutlass::bfloat16_t;
  typename Kernel::Params params{};
  SONICMOE_TRY(make_weight_tensor_map<Mainloop>(&params.mainloop.tma_b, p.w2, p.n, p.d, p.num_experts));
  params.mainloop.gather_src = static_cast<const Element*>(p.d_out);
  params.mainloop.gather_idx = p.gather_idx;
  params.mainloop.gather_src_rows = static_cast<int>(p.num_tokens);
  params.mainloop.k = static_cast<int>(p.d);
  params.epilogue.h = static_cast<const Element*>(p.h);
  params.epilogue.row_score = p.row_score;
  params.epilogue.d_h = static_cast<Element*>(p.d_h);
  params.epilogue.a_scaled = static_cast<Element*>(p.a_scaled);
  params.epilogue.d_score_partial = p.d_score_partial;
  params.epilogue.n = static_cast<int>(p.n);
  return launch_varlen_gemm<Kernel>(params, p.expert_offsets, p.m_total, p.num_experts, p.sm_count,
                                    p.stream, p.partial_rows);
}

}  // namespace sonicmoe::sm90
