// K1: bf16 up-projection, A rows gathered from x by cp.async, w1 gate/up halves paired by
// TMA, SwiGLU epilogue storing H and A; ping-pong 128x128x64 tiles, 4 stages, sm90a.
#include "sm90/grouped_gemm_sm90.h"
#include "sm90/varlen_gemm_launch_sm90.cuh"

namespace sonicmoe::sm90 {

Status run_up_proj(const UpProjParams& p) {
  using Mainloop = VarlenMainloop<kVarlenTileM, kVarlenTileN, kVarlenTileK, kVarlenStages, /*gather=*/true>;
  using Kernel = VarlenGemmKernel<Mainloop, SwiGLUEpilogue<kVarlenTileM, kVarlenTileN>>;
  typename Kernel::Params params{};
  SONICMOE_TRY(make_weight_tensor_map<Mainloop>(&params.mainloop.tma_b, p.w1, 2 * p.n, p.d, p.num_experts));
  params.mainloop.gather_src = static_cast<const cutlass::bfloat16_t*>(p.x);
  params.mainloop.gather_idx = p.gather_idx;
  params.mainloop.gather_src_rows = static_cast<int>(p.num_tokens);
  params.mainloop.k = static_cast<int>(p.d);
  params.epilogue.h = static_cast<cutlass::bfloat16_t*>(p.h);
  params.epilogue.a = static_cast<cutlass::bfloat16_t*>(p.a);
  params.epilogue.n = static_cast<int>(p.n);
  return launch_varlen_gemm<Kernel>(params, p.expert_offsets, p.m_total, p.num_experts, p.sm_count,
                                    p.stream, p.partial_rows);
}

}  // namespace sonicmoe::sm90
