// Tile choice by measurement: a kAuto call of a grouped GEMM op times the op's candidate
// configurations once per problem class and device, on the call's own operands, and keeps the
// fastest, in memory and in a file per device. The shape rules of sm90/heuristics.h stay the
// choice wherever tuning is off or not allowed, and the tie-break: a candidate replaces the rule's
// pick only when it is faster by more than kAutotuneMargin.
//
//   SONICMOE_AUTOTUNE=0      rules only: no timing, no cache read or written
//   SONICMOE_CACHE_DIR=dir   the cache files' folder (default $XDG_CACHE_HOME/sonicmoe, else
//                            ~/.cache/sonicmoe; empty: in memory only)
//   SONICMOE_AUTOTUNE_SETTLE_MS=ms  each timed window follows about this long of its own
//                            candidate's launches (default kSettleMs; 0: one launch)
//
// A cache file is keyed by the device's name, SM count and driver version, by the library's
// version, by the timing's name (with its settle) and by the number of tile configurations (a
// file from before one was added never timed it); a choice once cached is reused by every later
// call of its class (deterministic).
// Tuning never runs while the stream is being captured into a CUDA graph (the rule's pick, or
// the cached one, is launched instead), and torch.compile traces fake tensors, which never reach
// this code. Tuning synchronises the host with the stream once, on the class's first call.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "sonicmoe.h"

namespace sonicmoe::autotune {

// The ops whose kAuto is tuned.
enum class Op : int { kUpProj = 1, kGroupedGemm = 2, kGroupedGemmKN = 3, kDownProjGrad = 4, kWeightGrad = 5 };

// A problem class: shapes that share one choice. m_total enters by its bit width (a class spans
// a factor of 2 of rows), so a training run's batches, token rounding's counts included, meet a
// few classes.
struct Key {
  Op op = Op::kUpProj;
  int64_t n_out = 0;   // the op's output columns (K1, K4: n; K2, K6: n_out; K5 / K7: n_out)
  int64_t k = 0;       // the op's reduction length (K1, K4: d; K5 / K7: m_out)
  int rows_bits = 0;   // bit width of m_total
  int num_experts = 0;
  int sm_count = 0;
  int flags = 0;       // op-specific: partial_rows, gather_a, the addend, rows_past_end_zeroed
  bool operator==(const Key& o) const {
    return op == o.op && n_out == o.n_out && k == o.k && rows_bits == o.rows_bits &&
           num_experts == o.num_experts && sm_count == o.sm_count && flags == o.flags;
  }
};

int bit_width(int64_t m_total);

// A candidate faster than the rule's pick by less than this fraction does not replace it.
constexpr double kAutotuneMargin = 0.01;

// The cache file's line for a choice, and back (false for a malformed line).
std::string format_entry(const Key& key, GemmTileConfig config);
bool parse_entry(const std::string& line, Key* key, GemmTileConfig* config);

// The index of the candidate to keep from its measured times (< 0: failed): the fastest, unless
// the rule's candidate is within kAutotuneMargin of it. -1 when none ran.
int choose_fastest(const std::vector<GemmTileConfig>& candidates, const std::vector<float>& ms, GemmTileConfig rule);

// The varlen kernel's configurations every varlen op takes (K1 and K4 take these only, token
// rounding's K2 too; K6 adds grouped_gemm's own ping-pong 128 x 192, K2 that and the ptr-array ones).
inline const std::vector<GemmTileConfig>& varlen_candidates() {
  static const std::vector<GemmTileConfig> c{
      GemmTileConfig::kVarlenPingpong128x128x64, GemmTileConfig::kVarlenCooperative128x256x64,
      GemmTileConfig::kVarlenCooperative256x128x64, GemmTileConfig::kVarlenCooperative128x256x64C2x1,
      GemmTileConfig::kVarlenPingpong128x128x64C2x1};
  return c;
}

// Whether tuning is on (SONICMOE_AUTOTUNE is not "0").
bool enabled();

// Why a settle: back to back a layer's step runs at the card's power cap, where a kernel's clock
// follows the power of the last ~75 ms and more (docs/performance.md §1). Windows that follow
// another candidate's run at that candidate's clock, so a tile that spends less energy per FLOP
// (2x1 clusters multicasting B) gets no credit for it; after its own settle it does. On an H100
// the settled choices put K6 at qwen3-235b-a22b and K2 at deepseek-v3 in 2x1 clusters, and the
// layer's fwd+bwd ran 0.7% / 1.2% faster than on the unsettled ones (benchmarks/ab_rules.py
// CONFIG tune=windows). The settles are most of a first step's tuning time (docs/performance.md,
// "How it times").
constexpr double kSettleMs = 150.0;
// A settle's launches at most: a small kernel's class is tuned in well under a second.
constexpr int kMaxSettleLaunches = 128;

// Only contenders are settled and timed: a candidate whose first (sizing) window took more than
// kContenderRatio times the fastest's. A settle moves a tile's time by the clock it runs at (a few
// percent), not by half; single-CTA tiles where 2x1 clusters gather x (K1 at d 4096) run 1.6-2.4x
// the cluster's time and would spend most of a class's tuning on settles that cannot win.
constexpr double kContenderRatio = 1.5;

// Which candidates go on from their sizing windows' time a launch (< 0: failed): those within
// kContenderRatio of the fastest's.
std::vector<bool> contenders(const std::vector<float>& sizing_ms);

// The settle in ms: SONICMOE_AUTOTUNE_SETTLE_MS, else kSettleMs; an error naming the variable
// and its value unless it is a number from 0 to 60000.
Status settle_ms(double* ms);

// The untimed launches ahead of a timed window: enough of ms_per_launch to fill settle, at least
// one, at most kMaxSettleLaunches (one where settle is 0 or the launch's time is unknown).
int settle_launches(double settle, float ms_per_launch);

// The cache file of the current device ("" with SONICMOE_CACHE_DIR empty).
std::string cache_path();

// Runs a kAuto call: launch(config) enqueues the op with that configuration on stream. The cached
// choice of key's class if there is one; otherwise, when tuning is on and the stream is not
// capturing, times each candidate (a window each to size the settles, then for the contenders the
// median of three windows of back-to-back launches, each after its settle, autotune.cpp), caches
// the choice and launches it; otherwise launches rule.
Status run(const Key& key, GemmTileConfig rule, const std::vector<GemmTileConfig>& candidates, cudaStream_t stream,
           const std::function<Status(GemmTileConfig)>& launch);

// Drops the in-memory choices (the files stay): the next call of each class reads the file again.
void clear_memory();

}  // namespace sonicmoe::autotune
