// Persistent tile schedulers of the varlen grouped GEMMs: they read expert_offsets on the
// device, so the host never learns how many rows an expert received.
//
// VarlenTileScheduler (varlen M: K1, K2, K4, K6). Expert e owns rows [offsets[e], offsets[e+1])
// of the sorted layout and ceil(rows / kTileM) x n_blocks output tiles. Tiles are numbered
// expert by expert with the m block fastest (the CTAs that run together share B columns of one
// expert, which stay in L2), and CTA b takes tiles b, b + gridDim.x, ... Every role of a CTA
// (producer and both consumers) walks the same sequence; the walk reads each offset once per CTA.
#pragma once

#include <cstdint>

#include "common/tile_size.h"

namespace sonicmoe::sm90 {

struct VarlenTile {
  int expert;       // which expert's weight
  int row_start;    // first output row of the tile
  int rows;         // valid output rows in the tile, 1..kTileM; rows past it belong to others
  int m_block;      // within the expert
  int n_block;
  int k_start = 0;  // varlen K: the expert's first sorted row, the reduction's start
  int k_rows = 0;   // varlen K: the expert's rows, the reduction's length (0: all-zero tile)
};

template <int kTileM>
class VarlenTileScheduler {
 public:
  __device__ VarlenTileScheduler(const int32_t* expert_offsets, int num_experts, int n_blocks)
      : offsets_(expert_offsets), num_experts_(num_experts), n_blocks_(n_blocks),
        next_tile_(static_cast<int>(blockIdx.x)) {
    load_expert();
  }

  template <class KernelParams>
  static __device__ VarlenTileScheduler make(const KernelParams& p, int n_blocks) {
    return VarlenTileScheduler(p.expert_offsets, p.num_experts, n_blocks);
  }

  // The next tile of this CTA, or false when it has none left.
  __device__ bool next(VarlenTile& tile) {
    while (expert_ < num_experts_) {
      const int m_blocks = (expert_end_ - expert_start_ + kTileM - 1) / kTileM;
      const int local = next_tile_ - first_tile_of_expert_;
      if (local < m_blocks * n_blocks_) {
        tile.expert = expert_;
        tile.m_block = local % m_blocks;
        tile.n_block = local / m_blocks;
        tile.row_start = expert_start_ + tile.m_block * kTileM;
        tile.rows = min(kTileM, expert_end_ - tile.row_start);
        next_tile_ += static_cast<int>(gridDim.x);
        return true;
      }
      first_tile_of_expert_ += m_blocks * n_blocks_;
      ++expert_;
      load_expert();
    }
    return false;
  }

 private:
  __device__ void load_expert() {
    if (expert_ < num_experts_) {
      expert_start_ = expert_end_;
      expert_end_ = __ldg(offsets_ + expert_ + 1);
    }
  }

  const int32_t* offsets_;
  int num_experts_;
  int n_blocks_;
  int next_tile_;
  int expert_ = 0;
  int first_tile_of_expert_ = 0;
  int expert_start_ = 0;  // offsets[0] is 0 (validated by the kernel's prologue)
  int expert_end_ = 0;
};

// VarlenKTileScheduler (varlen K: the weight gradients K5, K7). Every expert owns a fixed
// m_out x n_out output, ceil(m_out / kTileM) x n_blocks tiles, whose reduction runs over the
// expert's rows [offsets[e], offsets[e+1]) of the sorted layout. Tiles are numbered expert by
// expert, m block fastest; output row r of expert e is row e * m_out + r of the (E * m_out,
// n_out) output. An expert without rows still gets its tiles: they store zeros.
template <int kTileM>
class VarlenKTileScheduler {
 public:
  __device__ VarlenKTileScheduler(const int32_t* expert_offsets, int num_experts, int m_out, int n_blocks)
      : offsets_(expert_offsets), m_out_(m_out), m_blocks_((m_out + kTileM - 1) / kTileM),
        n_blocks_(n_blocks), total_(num_experts * m_blocks_ * n_blocks), next_tile_(static_cast<int>(blockIdx.x)) {}

  template <class KernelParams>
  static __device__ VarlenKTileScheduler make(const KernelParams& p, int n_blocks) {
    return VarlenKTileScheduler(p.expert_offsets, p.num_experts, p.m_out, n_blocks);
  }

  __device__ bool next(VarlenTile& tile) {
    if (next_tile_ >= total_) return false;
    const int per_expert = m_blocks_ * n_blocks_;
    const int local = next_tile_ % per_expert;
    tile.expert = next_tile_ / per_expert;
    tile.m_block = local % m_blocks_;
    tile.n_block = local / m_blocks_;
    tile.row_start = tile.expert * m_out_ + tile.m_block * kTileM;
    tile.rows = min(kTileM, m_out_ - tile.m_block * kTileM);
    tile.k_start = __ldg(offsets_ + tile.expert);
    tile.k_rows = __ldg(offsets_ + tile.expert + 1) - tile.k_start;
    next_tile_ += static_cast<int>(gridDim.x);
    return true;
  }

 private:
  const int32_t* offsets_;
  int m_out_;
  int m_blocks_;
  int n_blocks_;
  int total_;
  int next_tile_;
};

}  // namespace sonicmoe::sm90
