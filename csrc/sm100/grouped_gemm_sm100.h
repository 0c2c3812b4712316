// Declarations of the sm100 (Blackwell, sm_100a) grouped GEMM instantiations (K2, K6, K1, K4, K5 and K7), one
// per csrc/instantiations/*_sm100.cu. Light header: no CUTLASS, so the host dispatcher compiles with
// the host compiler.
#pragma once

#include <cstddef>
#include <string>

#include "sonicmoe.h"

namespace sonicmoe::sm100 {

// The sm100 K2 / K6 configurations. They are not GemmTileConfigs: that enum numbers the sm90 kernels
// (the varlen ones last, host_rules.h) and its values are the torch API's tile_config; on sm100
// the host picks one of these by rule (sm100/heuristics.h), and tile_config must be auto.
enum class GemmConfig : int {
  // One SM per MMA: 128 x 256 tile, no cluster.
  k1Sm128x256x64 = 0,
  // tcgen05's pair MMA: the 2 CTAs of a 2 x 1 cluster compute one 256 x 256 tile (128 rows
  // each), each loading half of B, so B's smem traffic per output is halved.
  k2Sm256x256x64C2x1 = 1,
};

struct GemmShapeSm100 {
  int m, n, k;              // MMA tile (over the pair for 2-SM)
  int cluster_m, cluster_n;
  bool two_sm;
};

constexpr GemmShapeSm100 gemm_shape(GemmConfig config) {
  return config == GemmConfig::k2Sm256x256x64C2x1 ? GemmShapeSm100{256, 256, 64, 2, 1, true}
                                                  : GemmShapeSm100{128, 256, 64, 1, 1, false};
}

constexpr const char* gemm_config_name(GemmConfig config) {
  return config == GemmConfig::k2Sm256x256x64C2x1 ? "sm100_2sm_256x256x64_c2x1" : "sm100_1sm_128x256x64";
}

// The rules sm100 adds to sonicmoe::check_grouped_gemm's, for either b_layout on an sm_100 GPU
// (config auto only); "" when they hold. Defined in host/grouped_gemm.cpp.
std::string check_grouped_gemm(const GroupedGemmParams& params);

// One kernel per configuration, B layout (kNK: K2, kKN: K6) and, for kKN, with or without the
// router addend (addend_scale / addend_rows, fused in the epilogue).
// CUTLASS's workspace for one kernel (host arithmetic, no device access).
template <GemmConfig Config, WeightLayout BLayout = WeightLayout::kNK, bool RowAddend = false>
size_t grouped_gemm_cutlass_workspace_size(int num_experts, int sm_count);

// Builds the per-expert arguments on the device and launches the persistent kernel.
template <GemmConfig Config, WeightLayout BLayout = WeightLayout::kNK, bool RowAddend = false>
Status run_grouped_gemm(const GroupedGemmParams& params);

// The sm100 K1 configurations: the project's varlen gathered kernel (sm100/varlen_gemm_kernel_sm100.cuh),
// not CUTLASS's ptr-array one, so not GemmConfigs either; the host picks one by rule
// (sm100/heuristics.h), and tile_config must be auto.
enum class UpProjConfig : int {
  // One SM per MMA: 128 rows x (128 gate + 128 up columns), no cluster, 4 stages.
  k1Sm128x256x64 = 0,
};

// A tile of the varlen gathered kernel (K1, K4).
struct VarlenGatherShapeSm100 {
  int m, n, k;  // the MMA tile
  int stages;   // of the shared-memory ring
};

constexpr VarlenGatherShapeSm100 up_proj_shape(UpProjConfig /*config*/) { return {128, 256, 64, 4}; }

constexpr const char* up_proj_config_name(UpProjConfig /*config*/) { return "sm100_1sm_128x256x64"; }

// The rules sm100 adds to sonicmoe::check_up_proj's on an sm_100 GPU (config auto only); "" when
// they hold. Defined in host/up_proj.cpp.
std::string check_up_proj(const UpProjParams& params);

// K1 (the x gather, the gated activation): launches the persistent kernel for p.activation.
template <UpProjConfig Config>
Status run_up_proj(const UpProjParams& params);

// The sm100 K4 configurations: the same kernel and ring as K1's (the project's varlen gathered
// kernel), picked by rule (sm100/heuristics.h); tile_config must be auto.
enum class DownProjGradConfig : int {
  // One SM per MMA: 128 rows x 256 columns of n (two score slots), no cluster, 4 stages.
  k1Sm128x256x64 = 0,
};

constexpr VarlenGatherShapeSm100 down_proj_grad_shape(DownProjGradConfig /*config*/) { return {128, 256, 64, 4}; }

constexpr const char* down_proj_grad_config_name(DownProjGradConfig /*config*/) { return "sm100_1sm_128x256x64"; }

// The rules sm100 adds to sonicmoe::check_down_proj_grad's on an sm_100 GPU (config auto only); ""
// when they hold. Defined in host/down_proj_grad.cpp.
std::string check_down_proj_grad(const DownProjGradParams& params);

// K4 (the dO gather, the gated activation's backward, the score gradient): launches the
// persistent kernel for p.activation.
template <DownProjGradConfig Config>
Status run_down_proj_grad(const DownProjGradParams& params);

// The sm100 K5 / K7 configurations: the project's varlen-K kernel on the varlen gathered kernel's
// warp roles, picked by rule (sm100/heuristics.h); tile_config must be auto. Either gathers the
// 128-wide side (K7 runs as its transposed problem) and reads the 256-wide dense side:
enum class WeightGradConfig : int {
  // by TMA, in 64-column x 64-row boxes;
  k1Sm128x256x64 = 0,
  // by the cp.async producers, which stop at the expert's end (TMA boxes may read past offsets[E]
  // and cannot describe an empty tensor).
  k1Sm128x256x64CpAsyncDense = 1,
};

constexpr VarlenGatherShapeSm100 weight_grad_shape(WeightGradConfig /*config*/) { return {128, 256, 64, 4}; }

constexpr const char* weight_grad_config_name(WeightGradConfig config) {
  return config == WeightGradConfig::k1Sm128x256x64CpAsyncDense ? "sm100_1sm_128x256x64_cp_async_dense"
                                                                : "sm100_1sm_128x256x64";
}

// The rules sm100 adds to sonicmoe::check_weight_grad's on an sm_100 GPU (config auto only); ""
// when they hold. Defined in host/weight_grad.cpp.
std::string check_weight_grad(const WeightGradParams& params);

// K5 (gather_a) or K7: launches the persistent kernel.
template <WeightGradConfig Config>
Status run_weight_grad(const WeightGradParams& params);

}  // namespace sonicmoe::sm100
