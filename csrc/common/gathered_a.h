// Host side of the gathering mainloops (sm90's VarlenMainloop with kGatherA, sm100's
// VarlenGatherMainloop): their A operand's parameters.
#pragma once

#include <cstdint>

#include "cutlass/bfloat16.h"

namespace sonicmoe {

// A gathering mainloop's A operand: row r of the tile is src[gather_idx[r]], src (rows, k) bf16.
template <class MainloopParams>
void set_gathered_a(MainloopParams& m, const void* src, const int32_t* gather_idx, int64_t rows, int64_t k) {
  m.gather_src = static_cast<const cutlass::bfloat16_t*>(src);
  m.gather_idx = gather_idx;
  m.gather_src_rows = static_cast<int>(rows);
  m.k = static_cast<int>(k);
}

}  // namespace sonicmoe
