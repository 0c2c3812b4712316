// Host side of the sm100 varlen gathered GEMMs (K1, K4): the TMA descriptor of the weights, the
// kernels' parameters and the persistent launch (one CTA per SM, or per tile where there are fewer),
// which K5 / K7 (weight_grad_launch_sm100.cuh) share.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "common/cuda_check.h"
#include "common/dglu_tile.cuh"
#include "common/gathered_a.h"
#include "common/glu_tile.cuh"
#include "common/once_per_device.h"
#include "common/tensor_map.h"
#include "common/tile_size.h"
#include "sm100/arch_guard_sm100.h"
#include "sm100/collective/varlen_gather_mainloop_sm100.cuh"
#include "sm100/epilogue/dglu_epilogue_sm100.cuh"
#include "sm100/epilogue/glu_epilogue_sm100.cuh"
#include "sm100/grouped_gemm_sm100.h"
#include "sm100/varlen_gemm_kernel_sm100.cuh"
#include "sonicmoe.h"

namespace sonicmoe::sm100 {

// The K1 mainloop of a configuration: 4 stages of 48 KB (A 16 KB + B 32 KB) are 192 KB of the
// 227 KB a CTA may use; a fifth does not fit.
template <UpProjConfig kConfig>
using UpProjMainloop = VarlenGatherMainloop<up_proj_shape(kConfig).m, up_proj_shape(kConfig).n,
                                            up_proj_shape(kConfig).k, up_proj_shape(kConfig).stages>;

// The K4 mainloop: the same tile and ring, B = w2[e] (E, d, n) read N-major (the reduction is over d).
template <DownProjGradConfig kConfig>
using DownProjGradMainloop =
    VarlenGatherMainloop<down_proj_grad_shape(kConfig).m, down_proj_grad_shape(kConfig).n,
                         down_proj_grad_shape(kConfig).k, down_proj_grad_shape(kConfig).stages, /*k_major_b=*/false>;

// Fills the routing fields of params from the varlen problem and launches the persistent grid on
// problem.stream: one CTA per SM of problem.sm_count, or per tile where there are fewer (varlen K:
// params.m_out set by the caller).
template <class Kernel>
Status launch_varlen_gather(typename Kernel::Params& params, const VarlenProblem& problem) {
  params.expert_offsets = problem.expert_offsets;
  params.num_experts = problem.num_experts;
  params.m_total = static_cast<int>(problem.m_total);
  params.rows_end_early = problem.partial_rows;
  auto* kernel = &varlen_gather_gemm_kernel<Kernel>;
  int opted_in = 0;
  SONICMOE_TRY(once_per_device<&varlen_gather_gemm_kernel<Kernel>>(&opted_in, [&](int* done) -> Status {
    SONICMOE_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(Kernel::kSmemBytes)));
    *done = 1;
    return Status::success();
  }));
  const int64_t n_blocks = Kernel::Epilogue::n_blocks(params.epilogue);
  const int64_t max_tiles = Kernel::kVarlenK
                                ? varlen_k_tiles(problem.num_experts, params.m_out, Kernel::kTileM, n_blocks)
                                : varlen_max_tiles(problem.m_total, problem.num_experts, Kernel::kTileM, n_blocks);
  const int grid = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(problem.sm_count, max_tiles)));
  kernel<<<grid, Kernel::kThreads, Kernel::kSmemBytes, problem.stream>>>(params);
  SONICMOE_CUDA_TRY(cudaGetLastError());
  return Status::success();
}

template <UpProjConfig kConfig, GluActivation kAct>
Status run_up_proj_act(const UpProjParams& p) {
  using Mainloop = UpProjMainloop<kConfig>;
  using Kernel = VarlenGatherGemmKernel<Mainloop, GluEpilogue<Mainloop::kTileN, kAct>>;
  typename Kernel::Params params{};
  SONICMOE_TRY(set_up_proj_operands<Mainloop>(params, p));
  return launch_varlen_gather<Kernel>(params, p);
}

// The activation is a template parameter (each its own kernel, as on sm90); p.activation picks one.
// Each K1 unit instantiates it for one configuration.
template <UpProjConfig kConfig>
Status run_up_proj(const UpProjParams& p) {
  return with_glu_activation("up_proj", p.activation,
                             [&](auto act) { return run_up_proj_act<kConfig, decltype(act)::value>(p); });
}

// K4: dA' = dO[gather] @ w2[e], the gated activation's backward and the score gradient in the
// epilogue (DownProjGradParams), as sm90's K4 writes them.
template <DownProjGradConfig kConfig, GluActivation kAct>
Status run_down_proj_grad_act(const DownProjGradParams& p) {
  using Mainloop = DownProjGradMainloop<kConfig>;
  using Kernel = VarlenGatherGemmKernel<Mainloop, DGluEpilogue<Mainloop::kTileN, kAct>>;
  static_assert(Kernel::Epilogue::kSlotCols == kDownProjGradBlockCols, "d_score_partial slots");
  typename Kernel::Params params{};
  SONICMOE_TRY(set_down_proj_grad_operands<Mainloop>(params, p));
  params.epilogue.h = static_cast<const cutlass::bfloat16_t*>(p.h);
  return launch_varlen_gather<Kernel>(params, p);
}

template <DownProjGradConfig kConfig>
Status run_down_proj_grad(const DownProjGradParams& p) {
  return with_glu_activation("down_proj_grad", p.activation, [&](auto act) {
    return run_down_proj_grad_act<kConfig, decltype(act)::value>(p);
  });
}

}  // namespace sonicmoe::sm100

