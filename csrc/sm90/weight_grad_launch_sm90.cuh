// Host side of the sm90 varlen-K grouped GEMMs (K5, K7): one launch per mainloop configuration.
#pragma once

#include "sm90/varlen_gemm_launch_sm90.cuh"
// After the launch header: it needs cudaTypedefs.h's driver typedefs before any CUTLASS include.
#include "sm90/collective/varlen_k_mainloop_sm90.cuh"
#include "sm90/epilogue/tma_store_epilogue_sm90.cuh"
#include "common/weight_grad_problem.h"

namespace sonicmoe::sm90 {

// The output (E, rows, cols) bf16 as a (cols, rows, E) TMA tensor in box x box tiles (TmaStoreEpilogue).
inline Status make_expert_output_tensor_map(CUtensorMap* map, void* out, int64_t rows, int64_t cols,
                                            int num_experts, uint32_t box_side) {
  const uint64_t dims[3] = {uint64_t(cols), uint64_t(rows), uint64_t(num_experts)};
  const uint64_t strides[2] = {uint64_t(cols) * 2, uint64_t(cols) * uint64_t(rows) * 2};
  const uint32_t box[3] = {box_side, box_side, 1};
  return make_bf16_tensor_map(map, out, 3, dims, strides, box, "out");
}

// kTransposedOut (cooperative tiles only): the kernel computes out[e]^T (K7 in K5's shape); p then
// describes that transposed problem, its output written as (E, n_out, m_out).
template <class Mainloop, bool kTransposedOut = false>
Status run_weight_grad_with(const WeightGradParams& p) {
  // The cooperative tiles: TMA stores that drain behind the next tile's mainloop (measured: K5 8% and
  // K7 4% faster at deepseek-v3's 512 rows an expert, level to 2% faster at 2048-4096).
  // Ping-pong: staged stores (quad-transposed ones measured -1% to +3%, no gain).
  constexpr bool kCooperative = Mainloop::kConsumers == 2;
  static_assert(kCooperative || !kTransposedOut, "the transposed store is the cooperative tiles' TMA store");
  using Epilogue = cute::conditional_t<kCooperative, TmaStoreEpilogue<Mainloop::kTileM, Mainloop::kTileN, kTransposedOut>,
                                       StoreEpilogue<Mainloop::kTileM, Mainloop::kTileN, TileStore::kStaged>>;
  using Kernel = VarlenGemmKernel<Mainloop, Epilogue, VarlenKTileScheduler<Mainloop::kTileM, Mainloop::kClusterM>>;
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
  params.epilogue.n_out = static_cast<int>(p.n_out);
  if constexpr (kCooperative) {
    SONICMOE_TRY(make_expert_output_tensor_map(&params.epilogue.tma_out, p.out, kTransposedOut ? p.n_out : p.m_out,
                                               kTransposedOut ? p.m_out : p.n_out, p.num_experts, Epilogue::kBox));
  } else {
    params.epilogue.out = static_cast<Element*>(p.out);
  }
  params.m_out = static_cast<int>(p.m_out);
  return launch_varlen_k_gemm<Kernel>(params, p);
}

// K5 / K7 on cooperative tiles: the gathered operand 128 wide (cp.async), the other 256 wide by
// TMA, so a gathered row chunk serves twice the FLOPs of a ping-pong tile: K5 (A = dO gathered)
// on 128 x 256 x 64, K7 (B = x gathered) as the transposed problem on the same mainloop; 3 stages
// of 48 KB; kClusterM 1 or 2 (2 x 1 clusters multicasting the TMA side). The 256-wide side has no
// cp.async path: with partial_rows its rows up to a box past offsets[E] must be finite
// (down_proj_grad zeroes kRowsZeroedPastEnd of them).
template <int kClusterM>
Status run_weight_grad_cooperative_with(const WeightGradParams& p) {
  static_assert(kVarlenTileK <= kRowsZeroedPastEnd, "a TMA box reaches at most kVarlenTileK - 1 rows past the end");
  // 3 stages: the fourth's 48 KB hold the TMA stores' buffers.
  using Mainloop = VarlenKMainloop<128, 256, kVarlenTileK, 3, /*gather_a=*/true, /*tma_dense=*/true,
                                   /*consumers=*/2, kClusterM>;
  if (p.gather_a) return run_weight_grad_with<Mainloop>(p);
  // K7 in K5's shape: dW1[e]^T = x[gather]^T dH, x gathered on the 128-wide A side (the 256 x 128
  // tile with two 64-row atoms per warpgroup ran 0.64-0.82x the gathered copy + torch._grouped_mm),
  // stored transposed into (E, m_out, n_out).
  return run_weight_grad_with<Mainloop, /*transposed_out=*/true>(transposed_weight_grad(p));
}

}  // namespace sonicmoe::sm90
