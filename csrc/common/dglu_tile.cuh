// What K4's epilogues share across archs besides the math (common/glu_math.cuh): their
// parameters (the outputs and what they read), the n tiles and their B rows, and the score slots.
// K4's tile is kTileN contiguous columns of n (w2's columns; dA' = dO[gather] @ w2[e]).
#pragma once

#include <cstdint>

#include "cute/container/array.hpp"
#include "cutlass/bfloat16.h"
#include "cutlass/cutlass.h"

#include "common/contiguous_b_rows.cuh"
#include "common/varlen_tile_scheduler.cuh"
#include "sonicmoe.h"

namespace sonicmoe {

// K4's epilogue parameters where H is read from global memory (sm90's DGluEpilogue, sm100's).
struct DGluParams {
  const cutlass::bfloat16_t* h = nullptr;  // (m_total, 2n) in H's column order (common/h_column_order.h)
  const float* row_score = nullptr;        // (m_total)
  cutlass::bfloat16_t* d_h = nullptr;      // (m_total, 2n)
  cutlass::bfloat16_t* a_scaled = nullptr;  // (m_total, n)
  float* d_score_partial = nullptr;        // (m_total, ceil(n / kDownProjGradBlockCols))
  int n = 0;
};

// The outputs and row_score of K4's epilogue parameters (every arch's; H, read by each its own
// way, is set by the caller).
template <class EpilogueParams>
void set_dglu_outputs(EpilogueParams& e, const DownProjGradParams& p) {
  e.row_score = p.row_score;
  e.d_h = static_cast<cutlass::bfloat16_t*>(p.d_h);
  e.a_scaled = static_cast<cutlass::bfloat16_t*>(p.a_scaled);
  e.d_score_partial = p.d_score_partial;
  e.n = static_cast<int>(p.n);
}

// K4's n tiles, their B rows and the score slots. d_score_partial has one slot per 128 columns of
// n (kDownProjGradBlockCols): a 128-column tile writes one, a 256-column tile two.
template <int kTileN>
struct DGluTileColumns {
  static constexpr int kBoxRowsB = 64;
  static constexpr int kSlotCols = kDownProjGradBlockCols;
  static_assert(kTileN % kSlotCols == 0, "whole score slots per tile");

  template <class Params>
  static __host__ __device__ int n_blocks(const Params& p) { return (p.n + kTileN - 1) / kTileN; }
  template <class Params>
  static __device__ cute::array<int, kTileN / kBoxRowsB> b_rows(const Params&, const VarlenTile& t) {
    return contiguous_b_rows<kTileN, kBoxRowsB>(t);
  }
};

}  // namespace sonicmoe
