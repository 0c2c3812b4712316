// Runtime choice of the sm90 grouped GEMM tile configuration (the shapes live in
// common/tile_size.h). Measured on the H200 over the anchor down-projections:
// docs/perf-notes.md.
#pragma once

#include <cstdint>

#include "sonicmoe.h"

namespace sonicmoe::sm90 {

inline GemmTileConfig choose_grouped_gemm_config(int64_t m_total, int64_t n_out, int64_t k,
                                                 int num_experts) {
  (void)n_out;
  const int64_t rows_per_expert = num_experts > 0 ? m_total / num_experts : m_total;
  // Experts with few rows would waste most of a 128-row tile.
  if (rows_per_expert <= 64) return GemmTileConfig::kPingpong64x128x128;
  // A short K loop leaves little MMA to hide a ping-pong epilogue behind; the 128x256
  // cooperative tile stores fewer, larger tiles (paper-7b-n256: k = 256).
  if (k <= 256) return GemmTileConfig::kCooperative128x256x64;
  return GemmTileConfig::kPingpong128x128x64;
}

}  // namespace sonicmoe::sm90
