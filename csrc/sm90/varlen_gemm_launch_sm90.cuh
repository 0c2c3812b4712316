// Host side of the sm90 varlen-M grouped GEMMs: TMA descriptors and the persistent launch.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "common/cuda_check.h"
#include "common/dglu_tile.cuh"
#include "common/gathered_a.h"
#include "common/glu_tile.cuh"
#include "common/once_per_device.h"
#include "common/tensor_map.h"
#include "common/tile_size.h"
#include "sm90/collective/varlen_mainloop_sm90.cuh"
#include "sm90/epilogue/store_epilogue_sm90.cuh"
#include "sm90/epilogue/row_addend_store_epilogue_sm90.cuh"
#include "sm90/epilogue/glu_epilogue_sm90.cuh"
#include "sm90/epilogue/dglu_epilogue_sm90.cuh"
#include "sm90/epilogue/dglu_smem_source_epilogue_sm90.cuh"
#include "sm90/varlen_gemm_kernel_sm90.cuh"
#include "common/varlen_tile_scheduler.cuh"
#include "sonicmoe.h"

namespace sonicmoe::sm90 {

// The sorted activations (m_total, k) as a (k, m_total) TMA tensor in whole-tile boxes.
template <class Mainloop>
Status make_rows_tensor_map(CUtensorMap* map, const void* a, int64_t m_total, int64_t k) {
  return make_row_major_tensor_map(map, a, m_total, k, Mainloop::kTileK, Mainloop::kTileM, "a");
}

// Per device, once per kernel: the dynamic shared memory opt-in and, for a clustered kernel, how
// many of its clusters can be resident at once (cudaOccupancyMaxActiveClusters, a driver query
// that would otherwise run on every launch). *resident: that count, 1 for an unclustered kernel.
template <class Kernel>
Status prepare_on_device(const cudaLaunchConfig_t& cluster_config, int* resident) {
  return once_per_device<&varlen_gemm_kernel<Kernel>>(resident, [&](int* count) -> Status {
    auto* kernel = &varlen_gemm_kernel<Kernel>;
    SONICMOE_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(Kernel::kSmemBytes)));
    *count = 1;
    if constexpr (Kernel::kClusterM > 1) {
      SONICMOE_CUDA_TRY(cudaOccupancyMaxActiveClusters(count, kernel, &cluster_config));
      if (*count < 1) return Status::error("grouped GEMM: no 2 x 1 cluster of this kernel fits on the device");
    }
    return Status::success();
  });
}

// Fills the routing fields of params from the varlen problem and launches the persistent grid on
// problem.stream: one CTA per SM of problem.sm_count, or per tile where there are fewer tiles (at
// most max_tiles); with problem.partial_rows, rows past expert_offsets[E] are not written. A
// kernel of 2 x 1 clusters gets an even grid of at most as many clusters as can be resident at once (the
// SMs of a GPC pair up, so an odd GPC leaves one SM out), as sm_count holds and as there are
// pairs of tiles (max_tiles / 2). An sm_count below the device's leaves SMs to other streams.
template <class Kernel>
Status launch_persistent(typename Kernel::Params& params, const VarlenProblem& problem, int64_t max_tiles) {
  const int sm_count = problem.sm_count;
  const cudaStream_t stream = problem.stream;
  params.rows_end_early = problem.partial_rows;
  params.expert_offsets = problem.expert_offsets;
  params.num_experts = problem.num_experts;
  params.m_total = static_cast<int>(problem.m_total);
  auto* kernel = &varlen_gemm_kernel<Kernel>;
  constexpr int kClusterM = Kernel::kClusterM;
  cudaLaunchConfig_t config{};
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = kClusterM;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  config.blockDim = dim3(Kernel::kThreads);
  config.dynamicSmemBytes = Kernel::kSmemBytes;
  config.stream = stream;
  config.attrs = &cluster;
  config.numAttrs = 1;
  config.gridDim = dim3(static_cast<unsigned>(kClusterM * std::max(1, sm_count / kClusterM)));
  int resident = 1;
  SONICMOE_TRY(prepare_on_device<Kernel>(config, &resident));
  if constexpr (kClusterM == 1) {
    const int grid = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(sm_count, max_tiles)));
    kernel<<<grid, Kernel::kThreads, Kernel::kSmemBytes, stream>>>(params);
  } else {
    const int64_t units = max_tiles / kClusterM;  // pairs
    const int64_t clusters = std::min<int64_t>({resident, sm_count / kClusterM, units});
    config.gridDim = dim3(static_cast<unsigned>(kClusterM * std::max<int64_t>(1, clusters)));
    SONICMOE_CUDA_TRY(cudaLaunchKernelEx(&config, kernel, params));
  }
  SONICMOE_CUDA_TRY(cudaGetLastError());
  return Status::success();
}

// Varlen M (K1, K2, K4, K6): ceil(rows / kTileM) m blocks per expert.
template <class Kernel>
Status launch_varlen_gemm(typename Kernel::Params& params, const VarlenProblem& problem) {
  const int64_t n_blocks = Kernel::Epilogue::n_blocks(params.epilogue);
  return launch_persistent<Kernel>(params, problem,
                                   // a cluster's pairs, each of kClusterM tiles
                                   Kernel::kClusterM * varlen_max_tiles(problem.m_total, problem.num_experts,
                                                                        Kernel::kTileM * Kernel::kClusterM, n_blocks));
}

// Varlen K (K5, K7): a fixed m_out x n_out output per expert, params.m_out set by the caller.
template <class Kernel>
Status launch_varlen_k_gemm(typename Kernel::Params& params, const VarlenProblem& problem) {
  const int64_t n_blocks = Kernel::Epilogue::n_blocks(params.epilogue);
  return launch_persistent<Kernel>(params, problem,
                                   varlen_k_tiles(problem.num_experts, params.m_out, Kernel::kTileM, n_blocks));
}

// The ping-pong tile shape of the varlen kernels (measured on the H200); K5/K7 use it.
constexpr int kVarlenTileM = 128, kVarlenTileN = 128, kVarlenTileK = 64, kVarlenStages = 6;
// A cooperative tile's stage is 48 KB: 4 of them and the two staging buffers fill smem.
constexpr int kVarlenCooperativeStages = 4;
// A ping-pong 128 x 192 stage is 40 KB: 5 of them and two 64 x 64 staging windows.
constexpr int kVarlenPingpong192Stages = 5;

constexpr int varlen_stages(GemmTileShape s) {
  return !s.pingpong ? kVarlenCooperativeStages : s.n == 192 ? kVarlenPingpong192Stages : kVarlenStages;
}

// The varlen-M mainloop of a varlen configuration (tile_size.h).
// kVarlenCooperative128x256x64C2x1 runs in 2 x 1 clusters sharing B (a wide tile's B is 2/3 of
// its bytes).
template <GemmTileConfig kConfig, bool kGatherA, bool kKMajorB>
using VarlenMainloopFor =
    VarlenMainloop<gemm_tile_shape(kConfig).m, gemm_tile_shape(kConfig).n, kVarlenTileK,
                   varlen_stages(gemm_tile_shape(kConfig)), kGatherA,
                   kKMajorB, gemm_tile_shape(kConfig).pingpong ? 1 : 2,
                   gemm_tile_shape(kConfig).cluster_m>;

// out = a @ W on the varlen kernel: contiguous A by TMA, masked row stores. K2 reads the
// weights K-major, b (E, n_out, k); K6 N-major, b (E, k, n_out), with kRowAddend adding
// addend_scale[r] * addend_rows[e] (RowAddendStoreEpilogue). Each unit instantiates it for one
// varlen configuration.
template <bool kKMajorB, GemmTileConfig kConfig = GemmTileConfig::kVarlenPingpong128x128x64, bool kRowAddend = false>
Status run_varlen_store_gemm(const GroupedGemmParams& p) {
  using Mainloop = VarlenMainloopFor<kConfig, /*gather=*/false, kKMajorB>;
  // Quad-transposed stores: K2 and K6 0-12% faster than staged on every tile and config timed
  // (H200).
  using Epilogue = std::conditional_t<kRowAddend, RowAddendStoreEpilogue<Mainloop::kTileM, Mainloop::kTileN>,
                                      StoreEpilogue<Mainloop::kTileM, Mainloop::kTileN, TileStore::kQuadTranspose>>;
  using Kernel = VarlenGemmKernel<Mainloop, Epilogue>;
  typename Kernel::Params params{};
  SONICMOE_TRY(make_rows_tensor_map<Mainloop>(&params.mainloop.tma_a, p.a, p.m_total, p.k));
  SONICMOE_TRY(make_weight_tensor_map<Mainloop>(&params.mainloop.tma_b, p.b, p.n_out, p.k, p.num_experts));
  params.mainloop.k = static_cast<int>(p.k);
  params.epilogue.out = static_cast<cutlass::bfloat16_t*>(p.out);
  params.epilogue.n_out = static_cast<int>(p.n_out);
  if constexpr (kRowAddend) {
    params.epilogue.addend_scale = p.addend_scale;
    params.epilogue.addend_rows = static_cast<const cutlass::bfloat16_t*>(p.addend_rows);
    params.epilogue.m_total = static_cast<int>(p.m_total);
  }
  return launch_varlen_gemm<Kernel>(params, p);
}

// K1: the up-projection with the x gather and the gated activation fused in (UpProjParams).
// Each K1 unit instantiates it for one varlen configuration, every activation.
template <GemmTileConfig kConfig, GluActivation kAct>
Status run_up_proj_varlen_act(const UpProjParams& p) {
  using Mainloop = VarlenMainloopFor<kConfig, /*gather=*/true, /*k_major_b=*/true>;
  // Quad-transposed stores: the cooperative K1 2-11% faster than staged; the ping-pong K1, whose
  // epilogue overlaps the other warpgroup's mainloop, up to 5% slower (H200).
  constexpr TileStore kStore = gemm_tile_shape(kConfig).pingpong ? TileStore::kStaged : TileStore::kQuadTranspose;
  using Kernel = VarlenGemmKernel<Mainloop, GluEpilogue<Mainloop::kTileM, Mainloop::kTileN, kStore, kAct>>;
  typename Kernel::Params params{};
  SONICMOE_TRY(set_up_proj_operands<Mainloop>(params, p));
  return launch_varlen_gemm<Kernel>(params, p);
}

// The activation is a template parameter (each its own kernel: no branch in the epilogue's
// inner loop, SwiGLU's code as it was); p.activation picks one.
template <GemmTileConfig kConfig>
Status run_up_proj_varlen(const UpProjParams& p) {
  return with_glu_activation("up_proj", p.activation,
                             [&](auto act) { return run_up_proj_varlen_act<kConfig, decltype(act)::value>(p); });
}

// K4: dA' = dO[gather] @ w2[e] with dO rows gathered by cp.async and w2 (E, d, n) read N-major
// by TMA, the gated activation's backward / score-gradient epilogue reading H (DownProjGradParams).
// Each K4 unit instantiates it for one varlen configuration, every activation.
template <class Mainloop, bool kSmemSource, GluActivation kAct>
struct DownProjGradEpilogueFor {
  using type = DGluEpilogue<Mainloop::kTileM, Mainloop::kTileN, kAct>;
};
template <class Mainloop, GluActivation kAct>
struct DownProjGradEpilogueFor<Mainloop, true, kAct> {
  using type = DGluSmemSourceEpilogue<Mainloop::kTileM, Mainloop::kTileN, kAct>;
};

template <GemmTileConfig kConfig, GluActivation kAct>
Status run_down_proj_grad_varlen_act(const DownProjGradParams& p) {
  using Mainloop = VarlenMainloopFor<kConfig, /*gather=*/true, /*k_major_b=*/false>;
  // The cooperative 128 x 256 tiles read H through shared memory (DGluSmemSourceEpilogue).
  constexpr bool kSmemSource = !gemm_tile_shape(kConfig).pingpong && Mainloop::kTileM == 128 &&
                               Mainloop::kTileN == 256;
  using Kernel = VarlenGemmKernel<Mainloop, typename DownProjGradEpilogueFor<Mainloop, kSmemSource, kAct>::type>;
  static_assert(Kernel::Epilogue::kSlotCols == kDownProjGradBlockCols, "d_score_partial slots");
  using Element = cutlass::bfloat16_t;
  typename Kernel::Params params{};
  SONICMOE_TRY(set_down_proj_grad_operands<Mainloop>(params, p));
  if constexpr (kSmemSource) {
    SONICMOE_TRY(make_row_major_tensor_map(&params.epilogue.tma_h, p.h, p.m_total, 2 * p.n,
                                           Kernel::Epilogue::kQuarterCols, Kernel::Epilogue::kRows, "h"));
  } else {
    params.epilogue.h = static_cast<const Element*>(p.h);
  }
  return launch_varlen_gemm<Kernel>(params, p);
}

template <GemmTileConfig kConfig>
Status run_down_proj_grad_varlen(const DownProjGradParams& p) {
  return with_glu_activation("down_proj_grad", p.activation, [&](auto act) {
    return run_down_proj_grad_varlen_act<kConfig, decltype(act)::value>(p);
  });
}

}  // namespace sonicmoe::sm90
