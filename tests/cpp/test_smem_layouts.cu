// The shared-memory offsets the gathering cp.async producer computes by hand
// (VarlenMainloop::gather_offset, K1/K4) against CuTe's swizzled layouts, which
// WGMMA and TMA use: checked on the host, so a change of tile shape or layout that breaks the
// hand-derived formulas fails here rather than as wrong numbers on the GPU.
#include <gtest/gtest.h>

#include <cstdint>

#include "sm90/collective/varlen_mainloop_sm90.cuh"

namespace {

using Element = cutlass::bfloat16_t;

// Byte offset of element (i, j, stage) from a 1024-byte-aligned base (as the stages are), through
// CuTe's swizzled shared-memory pointer.
template <class Layout>
int64_t byte_offset(int i, int j, int stage) {
  Element* base = reinterpret_cast<Element*>(uintptr_t(1) << 20);
  auto tensor = cute::make_tensor(cute::make_smem_ptr(base), Layout{});
  return reinterpret_cast<const char*>(cute::raw_pointer_cast(&tensor(i, j, stage))) -
         reinterpret_cast<const char*>(base);
}

template <class Mainloop>
void expect_gather_offsets_match() {
  for (int stage = 0; stage < 2; ++stage)
    for (int t = 0; t < Mainloop::kProducerThreads; ++t)
      for (int j = 0; j < Mainloop::kPasses; ++j) {
        const int row0 = t / Mainloop::kChunksPerRow, chunk = t % Mainloop::kChunksPerRow;
        const int64_t want = int64_t(stage) * Mainloop::kBytesA + Mainloop::gather_offset(row0, chunk) +
                             int64_t(j) * Mainloop::kPassBytes;
        ASSERT_EQ(byte_offset<typename Mainloop::SmemLayoutA>(row0 + j * Mainloop::kRowsPerPass, chunk * 8, stage),
                  want)
            << "thread " << t << " pass " << j << " stage " << stage;
      }
}

TEST(SmemLayouts, gather_offsets_of_the_varlen_mainloop) {
  using namespace sonicmoe::sm90;
  expect_gather_offsets_match<VarlenMainloop<128, 128, 64, 6, /*gather=*/true>>();
  expect_gather_offsets_match<VarlenMainloop<256, 128, 64, 4, /*gather=*/true, true, /*consumers=*/2>>();
  expect_gather_offsets_match<VarlenMainloop<128, 256, 64, 4, /*gather=*/true, true, /*consumers=*/2>>();
  expect_gather_offsets_match<VarlenMainloop<128, 128, 64, 6, /*gather=*/true, /*k_major_b=*/false>>();
}

}  // namespace
