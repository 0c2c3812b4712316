// Persistent tile schedulers of the varlen grouped GEMMs (sm90 and sm100): they read expert_offsets on the
// device, so the host never learns how many rows an expert received.
//
// VarlenTileScheduler (varlen M: K1, K2, K4, K6). Expert e owns rows [offsets[e], offsets[e+1])
// of the sorted layout and ceil(rows / kTileM) x n_blocks output tiles. Tiles are numbered
// expert by expert with the m block fastest (the CTAs that run together share B columns of one
// expert, which stay in L2), and CTA b takes tiles b, b + gridDim.x, ... Every role of a CTA
// (producer and both consumers) walks the same sequence; the walk reads each offset once per CTA.
// With kClusterM = 2 (2 x 1 clusters sharing B by TMA multicast) the unit is a pair of
// consecutive tiles of that order: cluster c takes pairs c, c + clusters, ..., and its CTA of
// rank r tile 2 p + r. Both CTAs of a cluster so walk the same number of tiles. A pair within one
// expert and n block (most pairs: m blocks are fastest) shares B (shares_b); one across an n
// block's or an expert's end does not, and each CTA loads its own B. Only an odd tile count
// leaves a pair without its second tile: that CTA gets the first tile's coordinates with no rows
// (rows = 0), runs the pipeline (its peer's multicast needs it) and stores nothing.
#pragma once

#include <cstdint>

#include "common/tile_size.h"

namespace sonicmoe {

// The parameters of a varlen kernel (sm90's VarlenGemmKernel, sm100's VarlenGatherGemmKernel): its
// mainloop's and epilogue's, and the routing the scheduler and validate_expert_offsets read.
template <class MainloopParams, class EpilogueParams>
struct VarlenKernelParams {
  MainloopParams mainloop;
  EpilogueParams epilogue;
  const int32_t* expert_offsets = nullptr;
  int num_experts = 0;
  int m_total = 0;
  bool rows_end_early = false;  // offsets[E] <= m_total; rows past it are not written
  int m_out = 0;                // varlen K: output rows per expert (the scheduler's m blocks)
};

// Every CTA checks the offsets before touching memory: a bad offset would otherwise become an
// out-of-bounds load or store (the host rule of check_grouped_gemm, on the device). offsets[E] is
// m_total, or at most m_total where rows end early (partial_rows). It traps without a printf: any
// call in a kernel makes ptxas serialise every WGMMA. p: a kernel's Params (expert_offsets,
// num_experts, m_total, rows_end_early), read through the reference as the kernels always did.
template <class KernelParams>
__device__ inline void validate_expert_offsets(const KernelParams& p) {
  for (int e = threadIdx.x; e < p.num_experts; e += blockDim.x) {
    const int lo = __ldg(p.expert_offsets + e), hi = __ldg(p.expert_offsets + e + 1);
    const bool last_bad = p.rows_end_early ? hi > p.m_total : hi != p.m_total;
    if (lo > hi || (e == 0 && lo != 0) || (e == p.num_experts - 1 && last_bad)) __trap();
  }
}

struct VarlenTile {
  int expert;       // which expert's weight
  int row_start;    // first output row of the tile
  int rows;         // valid output rows in the tile, 0..kTileM (0: a cluster pair's empty half);
                    // rows past it belong to others
  int m_block;      // within the expert
  int n_block;
  int k_start = 0;  // varlen K: the expert's first sorted row, the reduction's start
  int k_rows = 0;   // varlen K: the expert's rows, the reduction's length (0: all-zero tile)
  bool shares_b = true;  // 2 x 1 clusters: both tiles of the pair need the same B
};

template <int kTileM, int kClusterM = 1>
class VarlenTileScheduler {
  static_assert(kClusterM == 1 || kClusterM == 2, "single CTAs or 2 x 1 clusters");

 public:
  __device__ VarlenTileScheduler(const int32_t* expert_offsets, int num_experts, int n_blocks)
      : offsets_(expert_offsets), num_experts_(num_experts), n_blocks_(n_blocks),
        rank_(static_cast<int>(blockIdx.x) % kClusterM),
        next_tile_(static_cast<int>(blockIdx.x) - static_cast<int>(blockIdx.x) % kClusterM) {
    load_expert();
  }

  template <class KernelParams>
  static __device__ VarlenTileScheduler make(const KernelParams& p, int n_blocks) {
    return VarlenTileScheduler(p.expert_offsets, p.num_experts, n_blocks);
  }
  // The same, built in place (sm100's kernel: a returned copy changed the sm100 K1's SASS).
  template <class KernelParams>
  __device__ VarlenTileScheduler(const KernelParams& p, int n_blocks)
      : VarlenTileScheduler(p.expert_offsets, p.num_experts, n_blocks) {}

  // The next tile of this CTA, or false when it has none left.
  __device__ bool next(VarlenTile& tile) {
    if constexpr (kClusterM == 1) {
      return locate</*advance=*/true>(next_tile_, tile);
    } else {
      VarlenTile first, second;
      if (!locate<false>(next_tile_, first)) return false;  // both CTAs stop at the same pair
      int second_tile = next_tile_ + 1;
      if (!locate<false>(second_tile, second)) {
        second = first;
        second.rows = 0;
      }
      tile = rank_ == 0 ? first : second;
      tile.shares_b = first.expert == second.expert && first.n_block == second.n_block;
      next_tile_ += static_cast<int>(gridDim.x);  // a pair per cluster, 2 tiles per pair
      return true;
    }
  }

 private:
  // Tile f of the order above (then f += gridDim.x when kAdvance). The expert cursor only moves
  // forward: f never decreases.
  template <bool kAdvance>
  __device__ bool locate(int& f, VarlenTile& tile) {
    while (expert_ < num_experts_) {
      const int m_blocks = (expert_end_ - expert_start_ + kTileM - 1) / kTileM;
      const int local = f - first_tile_of_expert_;
      if (local < m_blocks * n_blocks_) {
        tile.expert = expert_;
        tile.m_block = local % m_blocks;
        tile.n_block = local / m_blocks;
        tile.row_start = expert_start_ + tile.m_block * kTileM;
        tile.rows = min(kTileM, expert_end_ - tile.row_start);
        if constexpr (kAdvance) f += static_cast<int>(gridDim.x);
        return true;
      }
      first_tile_of_expert_ += m_blocks * n_blocks_;
      ++expert_;
      load_expert();
    }
    return false;
  }

  __device__ void load_expert() {
    if (expert_ < num_experts_) {
      expert_start_ = expert_end_;
      expert_end_ = __ldg(offsets_ + expert_ + 1);
    }
  }

  const int32_t* offsets_;
  int num_experts_;
  int n_blocks_;
  int rank_;       // the CTA's rank in its cluster: which tile of a pair it runs
  int next_tile_;  // with clusters, the pair's first tile
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
// With kClusterM = 2 the unit is a pair of m blocks 2 i, 2 i + 1 of one expert and n block, so
// both tiles of a pair share the dense operand (multicast) and run the same k steps, which keeps
// the two CTAs' stage rings in step. An odd m block count leaves the last pair's second tile past
// m_out (rows = 0): that CTA runs the pipeline for its peer and stores nothing.
template <int kTileM, int kClusterM = 1>
class VarlenKTileScheduler {
  static_assert(kClusterM == 1 || kClusterM == 2, "single CTAs or 2 x 1 clusters");

 public:
  __device__ VarlenKTileScheduler(const int32_t* expert_offsets, int num_experts, int m_out, int n_blocks)
      : offsets_(expert_offsets), m_out_(m_out), m_blocks_((m_out + kTileM - 1) / kTileM),
        m_units_((m_blocks_ + kClusterM - 1) / kClusterM), n_blocks_(n_blocks),
        total_(num_experts * m_units_ * n_blocks), rank_(static_cast<int>(blockIdx.x) % kClusterM),
        next_unit_(static_cast<int>(blockIdx.x) / kClusterM) {}

  template <class KernelParams>
  static __device__ VarlenKTileScheduler make(const KernelParams& p, int n_blocks) {
    return VarlenKTileScheduler(p.expert_offsets, p.num_experts, p.m_out, n_blocks);
  }
  template <class KernelParams>
  __device__ VarlenKTileScheduler(const KernelParams& p, int n_blocks)
      : VarlenKTileScheduler(p.expert_offsets, p.num_experts, p.m_out, n_blocks) {}

  __device__ bool next(VarlenTile& tile) {
    if (next_unit_ >= total_) return false;
    const int per_expert = m_units_ * n_blocks_;
    const int local = next_unit_ % per_expert;
    tile.expert = next_unit_ / per_expert;
    tile.m_block = (local % m_units_) * kClusterM + rank_;
    tile.n_block = local / m_units_;
    tile.row_start = tile.expert * m_out_ + tile.m_block * kTileM;
    tile.rows = max(0, min(kTileM, m_out_ - tile.m_block * kTileM));
    tile.k_start = __ldg(offsets_ + tile.expert);
    tile.k_rows = __ldg(offsets_ + tile.expert + 1) - tile.k_start;
    next_unit_ += static_cast<int>(gridDim.x) / kClusterM;
    return true;
  }

 private:
  const int32_t* offsets_;
  int m_out_;
  int m_blocks_;
  int m_units_;  // m blocks per n block, in pairs when clustered
  int n_blocks_;
  int total_;    // units (tiles, or pairs) of the whole problem
  int rank_;     // the CTA's rank in its cluster: which m block of a pair it runs
  int next_unit_;
};

}  // namespace sonicmoe
