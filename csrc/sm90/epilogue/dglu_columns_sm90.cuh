// K4 (backward through the down-projection and the gated activation). The accumulators are
// dA' = dO[gather] @ w2[e] over kTileN (128 or 256) of the n columns; with H (kept by K1) and the
// row's score s, act one of common/glu_math.cuh's:
//   A = act(gate) * up, dA = s * dA',
//   dH = [dA * up * act'(gate), dA * act(gate)], A' = s * A, dS partial = sum_c dA' * A.
// H arrives in registers as 16-byte chunks already in the accumulator's layout (H's column
// order, common/h_column_order.h; a trailing partial block is transposed across the quad); dH
// and A' leave in column order, transposed across each quad into 16-byte chunks
// (TileStore::kQuadTranspose; staging them through shared memory measured slower on the H200).
// The dS partial of each row and 128-column slot (kSlotCols) goes to its own place, summed over
// the slots in a fixed order later (deterministic, no atomics).
//
// This header holds what K4's two epilogues (dglu_epilogue_sm90.cuh: H in registers;
// dglu_smem_source_epilogue_sm90.cuh: H through shared memory) share: the math of 4 column
// groups, and the n tiles, their B rows and the score slots.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cute/tensor.hpp"

#include "common/dglu_tile.cuh"
#include "common/glu_math.cuh"
#include "sm90/epilogue/epilogue_tile_sm90.cuh"
#include "sm90/epilogue/store_helpers_sm90.cuh"
#include "sm90/ptx.cuh"
#include "common/varlen_tile_scheduler.cuh"

namespace sonicmoe::sm90 {

// K4's math for the 4 column groups j0 .. j0 + 3 of accumulator row (v1, m): g4 / u4 hold H's gate
// and up pairs in the accumulator's layout; returns dH's gate and up pairs
// and A' = s * A, and adds the row's dS terms to d_score.
template <GluActivation kAct, class Accumulator>
__device__ __forceinline__ void dglu_groups(const Accumulator& accum, int v1, int m, int j0, float score,
                                               const uint32_t (&g4)[4], const uint32_t (&u4)[4], uint32_t (&dg4)[4],
                                               uint32_t (&du4)[4], uint32_t (&as4)[4], float& d_score) {
  using namespace cute;
  CUTLASS_PRAGMA_UNROLL
  for (int b = 0; b < 4; ++b) {
    const float2 g = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&g4[b]));
    const float2 u = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u4[b]));
    float dg[2], du[2], as[2];
    CUTLASS_PRAGMA_UNROLL
    for (int v0 = 0; v0 < 2; ++v0) {
      const float gate = v0 ? g.y : g.x, up = v0 ? u.y : u.x;
      const float d_a_prime = accum(make_coord(make_coord(v0, v1, j0 + b), m, 0));
      dglu_column<kAct>(gate, up, d_a_prime, score, dg[v0], du[v0], as[v0], d_score);
    }
    dg4[b] = pack_bf16x2(dg[0], dg[1]);
    du4[b] = pack_bf16x2(du[0], du[1]);
    as4[b] = pack_bf16x2(as[0], as[1]);
  }
}

// What K4's two epilogues share (DGluEpilogue: H in registers; DGluSmemSourceEpilogue: H
// through shared memory): the n tiles, their B rows and the score slots (common/dglu_tile.cuh),
// and the slots' stores from the quads' partial sums.
template <int kTileN>
struct DGluColumns : DGluTileColumns<kTileN> {
  using DGluTileColumns<kTileN>::kSlotCols;

  // A row's dS over one slot's columns (`slot` of the tile): the 4 lanes of a quad hold the same
  // row's columns, summed in a fixed order. A slot past n (a 256-column tile's second half) has
  // no place and holds only zeros.
  template <class Params>
  static __device__ void store_slot(const Params& p, float d_score, bool row_ok, int64_t row, int n_block, int slot,
                                    int slots) {
    d_score += __shfl_xor_sync(0xffffffffu, d_score, 1);
    d_score += __shfl_xor_sync(0xffffffffu, d_score, 2);
    slot += n_block * (kTileN / kSlotCols);
    if (row_ok && threadIdx.x % 4 == 0 && slot < slots) p.d_score_partial[row * slots + slot] = d_score;
  }
};

}  // namespace sonicmoe::sm90
