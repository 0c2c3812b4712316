// What the sm100 epilogues of the varlen gathered kernel (K1's GluEpilogue, K4's DGluEpilogue)
// share: with the sorted rows as M, TMEM lane r holds tile row r, so each of the 128 epilogue
// threads owns one row; warp w reads TMEM lanes [32 w, 32 w + 32) (the hardware's rule for warp
// w % 4), kTmemCols fp32 columns per tcgen05.ld.
#pragma once

#include <cstdint>
#include <utility>

#include "cute/arch/copy_sm100.hpp"

#include "common/varlen_tile_scheduler.cuh"

namespace sonicmoe::sm100 {

constexpr int kEpilogueThreads = 128;  // 4 warps, one TMEM lane (tile row) each thread
constexpr int kTmemCols = 32;          // columns per tcgen05.ld (32x32b.x32: 32 registers)

// Thread thread_idx's row of the tile whose accumulator starts at TMEM column tmem_acc.
struct TmemRow {
  uint32_t lane_base;  // TMEM address of the warp's lanes at the accumulator's first column
  bool row_ok;         // a row of the tile (else nothing is stored)
  int64_t row;         // the sorted row

  __device__ TmemRow(uint32_t tmem_acc, const VarlenTile& t, int thread_idx)
      : lane_base(tmem_acc + (uint32_t(thread_idx / 32 * 32) << 16)),
        row_ok(thread_idx < t.rows),
        row(t.row_start + thread_idx) {}
};

// kTmemCols columns of this thread's TMEM lane from address addr into r (the CuTe atom, one
// register each). Warp-wide; the registers are valid after cutlass::arch::fence_view_async_tmem_load.
template <size_t... I>
__device__ __forceinline__ void tmem_load_cols(uint32_t addr, uint32_t (&r)[kTmemCols], std::index_sequence<I...>) {
  cute::SM100_TMEM_LOAD_32dp32b32x::copy(addr, r[I]...);
}
__device__ __forceinline__ void tmem_load_cols(uint32_t addr, uint32_t (&r)[kTmemCols]) {
  tmem_load_cols(addr, r, std::make_index_sequence<kTmemCols>{});
}

}  // namespace sonicmoe::sm100
