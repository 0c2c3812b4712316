// Persistent tile scheduler of the varlen-M grouped GEMMs (K1, K2): reads expert_offsets on
// the device, so the host never learns how many rows an expert received.
//
// Expert e owns rows [offsets[e], offsets[e+1]) of the sorted layout and
// ceil(rows / kTileM) x n_blocks output tiles. Tiles are numbered expert by expert with the
// m block fastest (the CTAs that run together share B columns of one expert, which stay in
// L2), and CTA b takes tiles b, b + gridDim.x, ... Every role of a CTA (producer and both
// consumers) walks the same sequence; the walk reads each offset once per CTA.
#pragma once

#include <cstdint>

#include "common/tile_size.h"

namespace sonicmoe::sm90 {

struct VarlenTile {
  int expert;     // which expert's weight
  int row_start;  // first row of the tile in the sorted layout
  int rows;       // valid rows in the tile, 1..kTileM; rows past it belong to the next expert
  int m_block;    // within the expert
  int n_block;
};

template <int kTileM>
class VarlenTileScheduler {
 public:
  __device__ VarlenTileScheduler(const int32_t* expert_offsets, int num_experts, int n_blocks)
      : offsets_(expert_offsets), num_experts_(num_experts), n_blocks_(n_blocks),
        next_tile_(static_cast<int>(blockIdx.x)) {
    load_expert();
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

}  // namespace sonicmoe::sm90
