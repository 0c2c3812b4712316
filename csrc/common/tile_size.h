// Compile-time tile shapes of the grouped GEMM configurations, as plain integers so host code
// (heuristics, workspace sizing, tests) reads them without CUTLASS. The sm90 launch template
// turns them into CuTe shapes.
#pragma once

#include <cstdint>

#include "sonicmoe.h"

namespace sonicmoe {

struct GemmTileShape {
  int m, n, k;                // CTA tile
  int cluster_m, cluster_n;   // thread-block cluster (TMA multicast of B along M, of A along N)
  bool pingpong;              // two consumer warpgroups on alternate tiles, else cooperative
};

constexpr GemmTileShape gemm_tile_shape(GemmTileConfig config) {
  switch (config) {
    // Each consumer warpgroup owns a whole 128x128 tile: 128 fp32 accumulators per thread,
    // and its epilogue overlaps the other warpgroup's MMA.
    case GemmTileConfig::kPingpong128x128x64: return {128, 128, 64, 2, 1, true};
    // Short tiles for experts with few rows; a deeper K step keeps the WGMMA pipe fed.
    case GemmTileConfig::kPingpong64x128x128: return {64, 128, 128, 2, 1, true};
    // Both warpgroups split one 128x256 tile (64 rows each): the most reuse per smem byte.
    case GemmTileConfig::kCooperative128x256x64: return {128, 256, 64, 2, 1, false};
    case GemmTileConfig::kCooperative256x128x64: return {256, 128, 64, 2, 1, false};
    // Half the mainloop iterations (and barrier round trips) per tile for long K.
    case GemmTileConfig::kPingpong128x128x128: return {128, 128, 128, 2, 1, true};
    // No cluster: no multicast, no cluster-wide barriers; each CTA loads its own B tile.
    case GemmTileConfig::kPingpong128x128x64C1x1: return {128, 128, 64, 1, 1, true};
    case GemmTileConfig::kVarlenPingpong128x128x64: return {128, 128, 64, 1, 1, true};
    case GemmTileConfig::kVarlenCooperative128x256x64: return {128, 256, 64, 1, 1, false};
    case GemmTileConfig::kVarlenCooperative256x128x64: return {256, 128, 64, 1, 1, false};
    case GemmTileConfig::kVarlenCooperative128x256x64C2x1: return {128, 256, 64, 2, 1, false};
    case GemmTileConfig::kVarlenPingpong128x128x64C2x1: return {128, 128, 64, 2, 1, true};
    case GemmTileConfig::kVarlenPingpong128x192x64: return {128, 192, 64, 1, 1, true};
    case GemmTileConfig::kAuto: break;
  }
  return {0, 0, 0, 0, 0, false};
}

constexpr const char* gemm_tile_config_name(GemmTileConfig config) {
  switch (config) {
    case GemmTileConfig::kAuto: return "auto";
    case GemmTileConfig::kPingpong128x128x64: return "pingpong_128x128x64_c2x1";
    case GemmTileConfig::kPingpong64x128x128: return "pingpong_64x128x128_c2x1";
    case GemmTileConfig::kCooperative128x256x64: return "cooperative_128x256x64_c2x1";
    case GemmTileConfig::kCooperative256x128x64: return "cooperative_256x128x64_c2x1";
    case GemmTileConfig::kPingpong128x128x128: return "pingpong_128x128x128_c2x1";
    case GemmTileConfig::kPingpong128x128x64C1x1: return "pingpong_128x128x64_c1x1";
    case GemmTileConfig::kVarlenPingpong128x128x64: return "varlen_pingpong_128x128x64";
    case GemmTileConfig::kVarlenCooperative128x256x64: return "varlen_cooperative_128x256x64";
    case GemmTileConfig::kVarlenCooperative256x128x64: return "varlen_cooperative_256x128x64";
    case GemmTileConfig::kVarlenCooperative128x256x64C2x1: return "varlen_cooperative_128x256x64_c2x1";
    case GemmTileConfig::kVarlenPingpong128x128x64C2x1: return "varlen_pingpong_128x128x64_c2x1";
    case GemmTileConfig::kVarlenPingpong128x192x64: return "varlen_pingpong_128x192x64";
  }
  return "unknown";
}

// The configurations built on CUTLASS's ptr-array grouped GEMM, for code that must visit them
// all (dispatch, workspace size). The kVarlen* configurations are dispatched on their own.
template <GemmTileConfig... Configs>
struct GemmTileConfigList {};
using PtrArrayGemmTileConfigs =
    GemmTileConfigList<GemmTileConfig::kPingpong128x128x64, GemmTileConfig::kPingpong64x128x128,
                       GemmTileConfig::kCooperative128x256x64,
                       GemmTileConfig::kCooperative256x128x64,
                       GemmTileConfig::kPingpong128x128x128,
                       GemmTileConfig::kPingpong128x128x64C1x1>;

// Upper bound of the tile count of a varlen-M grouped GEMM with m_total rows over num_experts
// experts, whatever the routing: each expert wastes at most one partial m block. Sizes the
// persistent grid on the host and bounds the scheduler's int32 tile numbers.
constexpr int64_t varlen_max_tiles(int64_t m_total, int num_experts, int tile_m, int64_t n_blocks) {
  return ((m_total + tile_m - 1) / tile_m + num_experts) * n_blocks;
}

// Varlen K (K5, K7): every expert owns a fixed m_out x n_out output, so exactly these tiles.
constexpr int64_t varlen_k_tiles(int num_experts, int64_t m_out, int tile_m, int64_t n_blocks) {
  return int64_t(num_experts) * ((m_out + tile_m - 1) / tile_m) * n_blocks;
}

}  // namespace sonicmoe
