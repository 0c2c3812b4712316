// kAuto's choice of the sm100 configurations: the grouped GEMM (K2 and K6: either b_layout, the
// same tiles), the up-projection (K1), its backward (K4) and the expert weight gradients (K5, K7).
// Host-only, no CUTLASS: the dispatchers and the CPU tests read it.
#pragma once

#include <cstdint>

#include "sm100/grouped_gemm_sm100.h"

namespace sonicmoe::sm100 {

// The rule in words, for the error that refuses an explicit tile_config on sm100.
constexpr const char* kGroupedGemmRule =
    "auto picks 2-SM 256x256x64 (2x1 cluster) where experts average >= 256 rows, else 1-SM 128x256x64";

// The pair tile covers 256 rows of one expert: with fewer rows per expert on average, most pair
// tiles are half empty (an expert's last tile is partial) and the 1-SM 128-row tile wastes less.
constexpr GemmConfig choose_grouped_gemm_config(int64_t m_total, int64_t /*n_out*/, int64_t /*k*/,
                                                int num_experts) {
  return num_experts > 0 && m_total >= int64_t{256} * num_experts ? GemmConfig::k2Sm256x256x64C2x1
                                                                  : GemmConfig::k1Sm128x256x64;
}

// K1's rule in words, for the error that refuses an explicit tile_config on sm100.
constexpr const char* kUpProjRule = "auto picks 1-SM 128x256x64, the one sm100 K1 configuration so far";

// One configuration: 128 gate and 128 up columns per tile put the widest 1-SM tcgen05 N (256) on
// every gathered x row, and its two fp32 accumulators fill TMEM's 512 columns, so one tile's
// epilogue overlaps the next one's MMAs. A 2-SM pair tile would need both CTAs to gather (no
// shared A load to halve) and is not built yet.
constexpr UpProjConfig choose_up_proj_config(int64_t /*n*/, int64_t /*d*/) { return UpProjConfig::k1Sm128x256x64; }

// K4's rule in words, for the error that refuses an explicit tile_config on sm100.
constexpr const char* kDownProjGradRule =
    "auto picks 1-SM 128x256x64, the one sm100 down_proj_grad configuration so far";

// One configuration, K1's tile and ring: 256 columns of n per gathered dO row (the widest 1-SM
// tcgen05 N), two fp32 accumulators filling TMEM's 512 columns.
constexpr DownProjGradConfig choose_down_proj_grad_config(int64_t /*n*/, int64_t /*d*/) {
  return DownProjGradConfig::k1Sm128x256x64;
}

// K5 / K7's rule in words, for the error that refuses an explicit tile_config on sm100.
constexpr const char* kWeightGradRule =
    "auto picks 1-SM 128x256x64 with the dense operand by TMA, or by cp.async where partial_rows is set "
    "without rows_past_end_zeroed or m_total is 0";

// One tile, the gathered side 128 wide and the dense side 256 (the widest 1-SM tcgen05 N) so a
// gathered row chunk serves the most FLOPs. TMA loads whole 64-row boxes, past the expert's end
// too: rows past offsets[E] that may be unwritten (partial_rows without rows_past_end_zeroed) would
// meet zeros as NaN, and no descriptor describes an empty tensor (m_total 0), so there the
// producers copy the dense side as well.
constexpr WeightGradConfig choose_weight_grad_config(bool partial_rows, bool rows_past_end_zeroed, int64_t m_total) {
  return m_total == 0 || (partial_rows && !rows_past_end_zeroed) ? WeightGradConfig::k1Sm128x256x64CpAsyncDense
                                                                 : WeightGradConfig::k1Sm128x256x64;
}

}  // namespace sonicmoe::sm100
