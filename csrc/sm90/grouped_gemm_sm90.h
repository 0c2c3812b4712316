// Declarations of the sm90 grouped GEMM instantiations (one per csrc/instantiations/*.cu).
// Light header: no CUTLASS, so the dispatcher compiles quickly with the host compiler.
#pragma once

#include <cstddef>

#include "sonicmoe.h"

namespace sonicmoe::sm90 {

// CUTLASS's workspace for one configuration (host arithmetic, no device access).
template <GemmTileConfig Config>
size_t grouped_gemm_cutlass_workspace_size(int num_experts, int sm_count);

// Builds the per-expert arguments on the device and launches the persistent kernel.
template <GemmTileConfig Config>
Status run_grouped_gemm(const GroupedGemmParams& params);

// K2 on our varlen kernel (GemmTileConfig::kVarlenPingpong128x128x64); needs no workspace.
Status run_varlen_grouped_gemm(const GroupedGemmParams& params);
// The same with both consumer warpgroups on one tile (kVarlenCooperative128x256x64, 256x128x64,
// and the 128 x 256 one in 2 x 1 clusters: kVarlenCooperative128x256x64C2x1).
Status run_varlen_grouped_gemm_cooperative_128x256(const GroupedGemmParams& params);
Status run_varlen_grouped_gemm_cooperative_256x128(const GroupedGemmParams& params);
Status run_varlen_grouped_gemm_cooperative_128x256_c2x1(const GroupedGemmParams& params);
Status run_varlen_grouped_gemm_pingpong_128x128_c2x1(const GroupedGemmParams& params);
// Ping-pong 128 x 192 tiles (kVarlenPingpong128x192x64: K2 and K6 only).
Status run_varlen_grouped_gemm_pingpong_128x192(const GroupedGemmParams& params);

// K6 layout: out = a @ b[e], b (E, k, n_out) (WeightLayout::kKN), on the varlen kernel, one
// per varlen configuration.
Status run_varlen_grouped_gemm_kn(const GroupedGemmParams& params);
Status run_varlen_grouped_gemm_kn_cooperative_128x256(const GroupedGemmParams& params);
Status run_varlen_grouped_gemm_kn_cooperative_256x128(const GroupedGemmParams& params);
Status run_varlen_grouped_gemm_kn_cooperative_128x256_c2x1(const GroupedGemmParams& params);
Status run_varlen_grouped_gemm_kn_pingpong_128x128_c2x1(const GroupedGemmParams& params);
Status run_varlen_grouped_gemm_kn_pingpong_128x192(const GroupedGemmParams& params);
// The same adding addend_scale[r] * addend_rows[e] to each row (RowAddendStoreEpilogue).
Status run_varlen_grouped_gemm_kn_addend(const GroupedGemmParams& params);
Status run_varlen_grouped_gemm_kn_addend_cooperative_128x256(const GroupedGemmParams& params);
Status run_varlen_grouped_gemm_kn_addend_cooperative_256x128(const GroupedGemmParams& params);
Status run_varlen_grouped_gemm_kn_addend_cooperative_128x256_c2x1(const GroupedGemmParams& params);
Status run_varlen_grouped_gemm_kn_addend_pingpong_128x128_c2x1(const GroupedGemmParams& params);
Status run_varlen_grouped_gemm_kn_addend_pingpong_128x192(const GroupedGemmParams& params);

// K4 (run_down_proj_grad of sonicmoe.h) once the host rules have passed, one per varlen
// configuration (a 256-column tile writes two 128-column score slots).
Status run_down_proj_grad(const DownProjGradParams& params);
Status run_down_proj_grad_cooperative_256x128(const DownProjGradParams& params);
Status run_down_proj_grad_cooperative_128x256(const DownProjGradParams& params);
Status run_down_proj_grad_cooperative_128x256_c2x1(const DownProjGradParams& params);
Status run_down_proj_grad_pingpong_128x128_c2x1(const DownProjGradParams& params);

// K1 (run_up_proj of sonicmoe.h) once the host rules have passed, one per varlen configuration.
Status run_up_proj(const UpProjParams& params);
Status run_up_proj_cooperative_128x256(const UpProjParams& params);
Status run_up_proj_cooperative_256x128(const UpProjParams& params);
Status run_up_proj_cooperative_128x256_c2x1(const UpProjParams& params);
Status run_up_proj_pingpong_128x128_c2x1(const UpProjParams& params);

// K5 / K7 (run_weight_grad of sonicmoe.h) once the host rules have passed: ping-pong 128 x 128,
// or cooperative with the gathered side 128 wide (128 x 256 gathering A, 256 x 128 gathering B),
// alone or in 2 x 1 clusters sharing the 256-wide side.
Status run_weight_grad(const WeightGradParams& params);
Status run_weight_grad_cooperative(const WeightGradParams& params);
Status run_weight_grad_cooperative_c2x1(const WeightGradParams& params);

}  // namespace sonicmoe::sm90
