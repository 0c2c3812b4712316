// Host side of the gathering mainloops (sm90's VarlenMainloop with kGatherA, sm100's
// VarlenGatherMainloop): their A operand's parameters, and the operands K1 and K4 give either
// family's gathering kernel.
#pragma once

#include <cstdint>

#include "cutlass/bfloat16.h"

#include "common/cuda_check.h"
#include "common/dglu_tile.cuh"
#include "common/tensor_map.h"
#include "sonicmoe.h"

namespace sonicmoe {

// A gathering mainloop's A operand: row r of the tile is src[gather_idx[r]], src (rows, k) bf16.
template <class MainloopParams>
void set_gathered_a(MainloopParams& m, const void* src, const int32_t* gather_idx, int64_t rows, int64_t k) {
  m.gather_src = static_cast<const cutlass::bfloat16_t*>(src);
  m.gather_idx = gather_idx;
  m.gather_src_rows = static_cast<int>(rows);
  m.k = static_cast<int>(k);
}

// K1's operands: x gathered, w1 (E, 2n, d) by TMA, the gated epilogue's A and H (null: not kept).
template <class Mainloop, class KernelParams>
Status set_up_proj_operands(KernelParams& params, const UpProjParams& p) {
  SONICMOE_TRY(make_weight_tensor_map<Mainloop>(&params.mainloop.tma_b, p.w1, 2 * p.n, p.d, p.num_experts));
  set_gathered_a(params.mainloop, p.x, p.gather_idx, p.num_tokens, p.d);
  params.epilogue.h = static_cast<cutlass::bfloat16_t*>(p.h);
  params.epilogue.a = static_cast<cutlass::bfloat16_t*>(p.a);
  params.epilogue.n = static_cast<int>(p.n);
  return Status::success();
}

// K4's operands but H: dO gathered, w2 (E, d, n) by TMA (N-major), the dGLU epilogue's outputs.
template <class Mainloop, class KernelParams>
Status set_down_proj_grad_operands(KernelParams& params, const DownProjGradParams& p) {
  SONICMOE_TRY(make_weight_tensor_map<Mainloop>(&params.mainloop.tma_b, p.w2, p.n, p.d, p.num_experts));
  set_gathered_a(params.mainloop, p.d_out, p.gather_idx, p.num_tokens, p.d);
  set_dglu_outputs(params.epilogue, p);
  return Status::success();
}

}  // namespace sonicmoe
