// Shape rules for the sm90 grouped GEMM tile configuration (the shapes live in
// common/tile_size.h): the one place these rules are written. They are the choice where the
// autotuner does not measure (host/autotune.h: SONICMOE_AUTOTUNE=0, CUDA graph capture) and its
// tie-break. Each rule's clause says why; the measurements behind them (H200, the anchor configs)
// are in docs/performance.md.
#pragma once

#include <cstdint>

#include "sonicmoe.h"

namespace sonicmoe::sm90 {

// 2 x 1 clusters (B multicast to a pair of consecutive tiles) pay where the K loop is long: the
// pair runs in lockstep and its per-tile costs spread over k / 64 steps. Clustered, K4 ran 11%
// faster at k 7168, K1 2-4.5% at k 4096-7168, K6 1-3.5% at k 3072-4096; at k 2048 K1, K2 and K6
// ran 0-5% slower. K4 has its own rule (choose_down_proj_grad_config).
constexpr int64_t kClusterMinK = 3072;

// K2.
inline GemmTileConfig choose_grouped_gemm_config(int64_t m_total, int64_t n_out, int64_t k,
                                                 int num_experts) {
  const int64_t rows_per_expert = num_experts > 0 ? m_total / num_experts : m_total;
  // Experts with few rows would waste most of a 128-row tile.
  if (rows_per_expert <= 64) return GemmTileConfig::kPingpong64x128x128;
  // A short K loop leaves little MMA to hide a ping-pong epilogue behind: our varlen kernel beat
  // the ptr-array ones at k 256 (420 vs 450 µs at paper-7b-n256).
  if (k <= 256) return GemmTileConfig::kVarlenPingpong128x128x64;
  // Few rows per expert into a wide output: the cooperative 128 x 256 tile reads each A row once
  // per 256 columns (deepseek-v3, 512 rows, n_out 7168: 7064 against ping-pong's 7494 µs).
  if (rows_per_expert <= 512)
    return n_out >= 4096 && n_out % 256 == 0 ? GemmTileConfig::kVarlenCooperative128x256x64
                                             : GemmTileConfig::kVarlenPingpong128x128x64;
  // Elsewhere CUTLASS's ptr-array ping-pong tile won by 2-11%.
  return GemmTileConfig::kPingpong128x128x64;
}

// K6 (dX~ = dH @ w1[e], w1 read N-major, k = 2n): cooperative 128 x 256 where the output is wide
// and experts hold many rows (3-11% faster than ping-pong at d 4096 with 2048 rows and at olmoe's
// 4096 rows; 1-1.5% slower at d 1536-2048 with 2048 rows); clustered where the K loop is long
// and experts hold >= 512 rows (8-9% faster than ping-pong at deepseek-v3, 1% faster than
// unclustered at qwen3-235b-a22b).
inline GemmTileConfig choose_grouped_gemm_kn_config(int64_t m_total, int64_t n_out, int64_t k, int num_experts) {
  const int64_t rows_per_expert = num_experts > 0 ? m_total / num_experts : m_total;
  if (n_out % 256 != 0) return GemmTileConfig::kVarlenPingpong128x128x64;
  if (k >= kClusterMinK && n_out >= 4096 && rows_per_expert >= 512) return GemmTileConfig::kVarlenCooperative128x256x64C2x1;
  const bool wide = rows_per_expert >= 1024 && (n_out >= 4096 || rows_per_expert >= 4096);
  return wide ? GemmTileConfig::kVarlenCooperative128x256x64 : GemmTileConfig::kVarlenPingpong128x128x64;
}

// K1: cooperative 128 x 256 (a gathered x row serves 128 gate and 128 up columns, half the gather
// work per FLOP) where n fills its 128-column halves: 1-46% faster than ping-pong 128 x 128 on 7
// of the 8 anchor configs (1.5% slower at paper-7b-n1024). Otherwise ping-pong, whose 64-column
// halves waste less of a partial N block. Clustered where the K loop (d) is long.
inline GemmTileConfig choose_up_proj_config(int64_t n, int64_t d) {
  if (n % 128 != 0) return GemmTileConfig::kVarlenPingpong128x128x64;
  return d >= kClusterMinK ? GemmTileConfig::kVarlenCooperative128x256x64C2x1
                           : GemmTileConfig::kVarlenCooperative128x256x64;
}

// K4: the clustered cooperative 128 x 256 tile (two score-gradient slots per tile, B multicast
// within a pair) where n fills whole 256-column tiles and the K loop (d) is >= 2048; otherwise
// ping-pong 128 x 128, whose epilogue overlaps the other warpgroup's mainloop. As the layer's
// backward: +0.5-5% at d >= 4096 (11% more clustered at deepseek-v3), 0 to +4.4% at d 2048; at
// d 1536 it lost 3-7%.
inline GemmTileConfig choose_down_proj_grad_config(int64_t n, int64_t d) {
  if (n % 256 != 0 || d < 2048) return GemmTileConfig::kVarlenPingpong128x128x64;
  return GemmTileConfig::kVarlenCooperative128x256x64C2x1;
}

// K5 / K7 (weight_grad): the cooperative tile whose gathered side is 128 wide (128 x 256 when A
// is gathered, 256 x 128 when B is) wherever every row is written: 1.6-3.0x the ping-pong tile's
// rate at all 8 anchor configs. Token rounding's buffers (partial_rows, unless the caller has
// zeroed the rows past the end) and empty problems take ping-pong's cp.async path. In 2 x 1
// clusters (the TMA side multicast within a pair of m blocks) where experts average
// >= kWeightGradClusterMinRows rows (0.5-2.5% faster at 2048-4096 rows, 1-2% slower at 1536), or
// where an expert's output has >= kWeightGradClusterMinOutput elements whatever its rows (1.5-3.3%
// faster at deepseek-v3's 512 rows and 14.7M / 29.4M elements: the multicast's L2 saving outweighs
// the short K loop).
constexpr int64_t kWeightGradClusterMinRows = 2048;
constexpr int64_t kWeightGradClusterMinOutput = int64_t(1) << 23;

inline GemmTileConfig choose_weight_grad_config(bool gather_a, bool partial_rows, int64_t m_total,
                                                int num_experts, int64_t m_out, int64_t n_out) {
  if (partial_rows || m_total == 0) return GemmTileConfig::kVarlenPingpong128x128x64;
  if (m_total >= kWeightGradClusterMinRows * num_experts || m_out * n_out >= kWeightGradClusterMinOutput)
    return GemmTileConfig::kVarlenCooperative128x256x64C2x1;
  return gather_a ? GemmTileConfig::kVarlenCooperative128x256x64 : GemmTileConfig::kVarlenCooperative256x128x64;
}

}  // namespace sonicmoe::sm90
