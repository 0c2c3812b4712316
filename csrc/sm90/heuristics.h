// Runtime choice of the sm90 grouped GEMM tile configuration (the shapes live in
// common/tile_size.h). Measured on the H200 over the anchor down-projections:
// docs/perf-notes.md.
#pragma once

#include <cstdint>

#include "sonicmoe.h"

namespace sonicmoe::sm90 {

// 2 x 1 clusters (kVarlenCooperative128x256x64C2x1: B multicast to both CTAs of a pair of
// consecutive tiles) pay where the K loop is long: the pair runs in lockstep, and its per-tile
// costs are spread over k / 64 steps. On the H200 (session 13, call 3; two rounds each) K4 on the
// cooperative 128 x 256 tile ran 11% faster clustered at deepseek-v3 (k 7168), K1 4.5% there and
// 2% at qwen3-235b-a22b (k 4096), K6 1-3.5% at k 3072 and 4096; at k 2048 (olmoe-1b-7b,
// qwen3-30b-a3b) K1, K2 and K6 ran 0-5% slower clustered. K4 has its own rule (from d 2048,
// choose_down_proj_grad_config), timed as the layer's backward.
constexpr int64_t kClusterMinK = 3072;

inline GemmTileConfig choose_grouped_gemm_config(int64_t m_total, int64_t n_out, int64_t k,
                                                 int num_experts) {
  const int64_t rows_per_expert = num_experts > 0 ? m_total / num_experts : m_total;
  // Experts with few rows would waste most of a 128-row tile.
  if (rows_per_expert <= 64) return GemmTileConfig::kPingpong64x128x128;
  // A short K loop leaves little MMA to hide a ping-pong epilogue behind; the 128x256
  // cooperative tile stores fewer, larger tiles (paper-7b-n256: k = 256).
  // Our varlen kernel beats the ptr-array ones at a short K loop (paper-7b-n256, k = 256:
  // 420 vs 450 µs) and with few rows per expert over many experts (deepseek-v3, 512 rows x 256
  // experts: 7238 vs 8558 µs); the ptr-array ping-pong tile wins by 2-11% elsewhere.
  if (k <= 256) return GemmTileConfig::kVarlenPingpong128x128x64;
  // Few rows per expert into a wide output: the cooperative 128 x 256 tile reads each A row once
  // per 256 columns. deepseek-v3 (512 rows, n_out 7168; session 12, call 2): 604 TF against
  // ping-pong's 570 with balanced groups, and 7064-7092 against 7494-7524 µs on top-K routing.
  if (rows_per_expert <= 512)
    return n_out >= 4096 && n_out % 256 == 0 ? GemmTileConfig::kVarlenCooperative128x256x64
                                             : GemmTileConfig::kVarlenPingpong128x128x64;
  return GemmTileConfig::kPingpong128x128x64;
}

// K6 (dX~ = dH @ w1[e], w1 read N-major, k = 2n): cooperative 128 x 256 where the output is wide
// and experts hold many rows. On the H200 (session 5, run 2) it ran 3-7% faster than ping-pong
// 128 x 128 at d 4096 with 2048 rows per expert and 11% at olmoe (d 2048, 4096 rows), but 1.5%
// slower at qwen3-30b (d 2048, 2048 rows) and 1% at d 1536. With a long K loop, clustered
// (kClusterMinK): at deepseek-v3 (512 rows, k 4096), where ping-pong had won in session 5, the
// clustered tile ran 8-9% faster than ping-pong in session 13 (call 3), 1% faster than the
// unclustered one at qwen3-235b-a22b (2048 rows, k 3072).
inline GemmTileConfig choose_grouped_gemm_kn_config(int64_t m_total, int64_t n_out, int64_t k, int num_experts) {
  const int64_t rows_per_expert = num_experts > 0 ? m_total / num_experts : m_total;
  if (n_out % 256 != 0) return GemmTileConfig::kVarlenPingpong128x128x64;
  if (k >= kClusterMinK && n_out >= 4096 && rows_per_expert >= 512) return GemmTileConfig::kVarlenCooperative128x256x64C2x1;
  const bool wide = rows_per_expert >= 1024 && (n_out >= 4096 || rows_per_expert >= 4096);
  return wide ? GemmTileConfig::kVarlenCooperative128x256x64 : GemmTileConfig::kVarlenPingpong128x128x64;
}

// K1's tile: cooperative 128 x 256 (a gathered x row serves 128 gate and 128 up columns, half
// the gather work per FLOP) where n fills its 128-column halves; it measured 1-46% faster than
// ping-pong 128 x 128 on 7 of the 8 anchor configs (1.5% slower at paper-7b-n1024).
// Otherwise ping-pong, whose 64-column halves waste less of a partial N block. Clustered where the
// K loop (d) is long (kClusterMinK).
inline GemmTileConfig choose_up_proj_config(int64_t n, int64_t d) {
  if (n % 128 != 0) return GemmTileConfig::kVarlenPingpong128x128x64;
  return d >= kClusterMinK ? GemmTileConfig::kVarlenCooperative128x256x64C2x1
                           : GemmTileConfig::kVarlenCooperative128x256x64;
}

// K4's tile: the clustered cooperative 128 x 256 tile (two score-gradient slots per tile, B
// multicast within a pair) where n fills whole 256-column tiles and the K loop (d) is >= 2048;
// otherwise ping-pong 128 x 128, whose epilogue overlaps the other warpgroup's mainloop. On the
// H200: unclustered at d >= 4096 up to 8% faster than ping-pong (session 11, calls 2-3; the
// layer's backward +0.5% to +5%), clustered 11% faster again at deepseek-v3 (session 13). At d 2048
// clustered, the layer's backward (session 14, calls 4-5): olmoe-1b-7b +4.4% / +3.2% / 0.0,
// qwen3-30b-a3b -0.7% / 0.0 / -0.5% (level); at d 1536 it lost (paper-7b-n1024 -6.7%,
// paper-7b-n256 -2.9%).
inline GemmTileConfig choose_down_proj_grad_config(int64_t n, int64_t d) {
  if (n % 256 != 0 || d < 2048) return GemmTileConfig::kVarlenPingpong128x128x64;
  return GemmTileConfig::kVarlenCooperative128x256x64C2x1;
}

// K5 / K7 (weight_grad): the cooperative tile whose gathered side is 128 wide (128 x 256 when A
// is gathered, 256 x 128 when B is: K7 runs it as the transposed 128 x 256 problem, K5's
// mainloop) wherever every row was written; on the H200 (session 7, call 4) it ran 1.6-3.0x
// the ping-pong tile's rate at all 8 anchor configs (K5 2.0-3.0x, K7 1.6-1.9x before its
// transposed form, which added 1.19-1.36x: session 12, call 3). Token rounding's buffers
// (partial_rows) and empty problems take ping-pong's cp.async path. In 2 x 1 clusters (the TMA
// side multicast within a pair of m blocks) where experts average >= kWeightGradClusterMinRows
// rows, the K loop's length: on the H200 (session 25, two rounds) K7 ran 1.3-1.5% faster
// clustered and K5 0.5-2.5% at 2048-4096 rows per expert, both 1-2% slower at 1536 (paper-7b:
// outputs of at most 3.1M elements an expert). Also where an expert's output has at least
// kWeightGradClusterMinOutput elements, whatever its rows: at deepseek-v3 (512 rows, 14.7M / 29.4M
// elements) with TMA stores, K7 ran 3.2% and K5 1.5-3.3% faster clustered (session 34, call 2):
// there the multicast's L2 traffic saving outweighs the short K loop.
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
