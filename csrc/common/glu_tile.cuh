// What K1's gated-activation kernels share across archs besides the math (common/glu_math.cuh):
// a tile's columns (w1 rows of its B boxes, the outputs), and the activation as a template argument.
#pragma once

#include <string>
#include <type_traits>

#include "cute/container/array.hpp"
#include "cutlass/bfloat16.h"
#include "cutlass/cutlass.h"

#include "common/varlen_tile_scheduler.cuh"
#include "sonicmoe.h"

namespace sonicmoe {

// The columns of a gated tile, shared by K1's epilogues (sm90, sm100): kTileN / 2 gate columns
// (w1 rows from n_block * kTileN / 2) and the matching up columns (w1 rows n + ...), so both halves
// of the gated activation meet in one tile without a weight copy (w1 is [gate | up], (2n, d) per
// expert), and the outputs those epilogues write.
template <int kTileN, int kBoxRows = 64>
struct GluTileColumns {
  static constexpr int kHalf = kTileN / 2;
  static constexpr int kBoxesPerHalf = kHalf / kBoxRows;
  static_assert(kHalf % kBoxRows == 0, "whole B boxes per half");

  struct Params {
    cutlass::bfloat16_t* h = nullptr;  // (m_total, 2n) in H's column order; nullptr: not kept (inference)
    cutlass::bfloat16_t* a = nullptr;  // (m_total, n)
    int n = 0;                         // intermediate size; w1 has 2n rows per expert
  };

  static __host__ __device__ int n_blocks(const Params& p) { return (p.n + kHalf - 1) / kHalf; }

  // Gate rows (past n: results are never stored), then up rows (past 2n: zero-filled by TMA).
  static __device__ cute::array<int, 2 * kBoxesPerHalf> b_rows(const Params& p, const VarlenTile& t) {
    cute::array<int, 2 * kBoxesPerHalf> rows;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kBoxesPerHalf; ++i) {
      rows[i] = t.n_block * kHalf + i * kBoxRows;
      rows[kBoxesPerHalf + i] = p.n + t.n_block * kHalf + i * kBoxRows;
    }
    return rows;
  }
};

// f(std::integral_constant<GluActivation, activation>{}): each activation its own kernel, so no
// branch in an epilogue's inner loop; op names the caller in the error for an unknown one.
template <class F>
Status with_glu_activation(const char* op, GluActivation activation, F&& f) {
  switch (activation) {
    case GluActivation::kSwiGLU: return f(std::integral_constant<GluActivation, GluActivation::kSwiGLU>{});
    case GluActivation::kGeGLU: return f(std::integral_constant<GluActivation, GluActivation::kGeGLU>{});
    case GluActivation::kReGLU: return f(std::integral_constant<GluActivation, GluActivation::kReGLU>{});
  }
  return Status::error(std::string(op) + ": activation = " + std::to_string(static_cast<int>(activation)) +
                       " breaks the rule: must name a GluActivation");
}

}  // namespace sonicmoe
