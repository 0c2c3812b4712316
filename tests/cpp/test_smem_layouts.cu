// The shared-memory offsets the gathering cp.async producers compute by hand
// (VarlenMainloop::gather_offset, K1/K4; VarlenKMainloop::copy_offset, K5/K7; sm100's
// VarlenGatherMainloop::gather_offset, K1, and its N-major B, K4; VarlenKMainloop::copy_offset,
// K5/K7, and its TMA boxes) against CuTe's swizzled layouts, which WGMMA, tcgen05
// MMA and TMA use: checked on the host, so a change of tile shape or layout that breaks the
// hand-derived formulas fails here rather than as wrong numbers on the GPU.
#include <gtest/gtest.h>

#include <cstdint>

#include "sm90/collective/varlen_k_mainloop_sm90.cuh"
#include "sm90/collective/varlen_mainloop_sm90.cuh"
#include "sm100/collective/varlen_gather_mainloop_sm100.cuh"
#include "sm100/collective/varlen_k_mainloop_sm100.cuh"

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

// sm100 K1: the UMMA layout is ((M, 16), 1, k blocks of 16, stage); element (m, k) of a stage is
// ((m, k % 16), 0, k / 16).
TEST(SmemLayouts, gather_offsets_of_the_sm100_gather_mainloop) {
  using Mainloop = sonicmoe::sm100::VarlenGatherMainloop<128, 256, 64, 4>;
  Element* base = reinterpret_cast<Element*>(uintptr_t(1) << 20);
  auto sA = cute::make_tensor(cute::make_smem_ptr(base), typename Mainloop::SmemLayoutA{});
  for (int stage = 0; stage < Mainloop::kStages; ++stage)
    for (int t = 0; t < Mainloop::kGatherThreads; ++t)
      for (int j = 0; j < Mainloop::kPasses; ++j) {
        const int row0 = t / Mainloop::kChunksPerRow, chunk = t % Mainloop::kChunksPerRow;
        const int row = row0 + j * Mainloop::kRowsPerPass, k = chunk * 8;
        const int64_t want = int64_t(stage) * Mainloop::kBytesA + Mainloop::gather_offset(row0, chunk) +
                             int64_t(j) * Mainloop::kPassBytes;
        const Element* at =
            cute::raw_pointer_cast(&sA(cute::make_coord(cute::make_coord(row, k % 16), 0, k / 16, stage)));
        ASSERT_EQ(reinterpret_cast<const char*>(at) - reinterpret_cast<const char*>(base), want)
            << "thread " << t << " pass " << j << " stage " << stage;
      }
  // B: each 64-row TMA box is one contiguous 8 KB block of 128-byte rows, box i at 8 KB i.
  auto sB = cute::make_tensor(cute::make_smem_ptr(base), typename Mainloop::SmemLayoutB{});
  for (int stage = 0; stage < Mainloop::kStages; ++stage)
    for (int i = 0; i < Mainloop::kBoxesB; ++i) {
      const Element* at = cute::raw_pointer_cast(&sB(cute::make_coord(cute::make_coord(64 * i, 0), 0, 0, stage)));
      EXPECT_EQ(reinterpret_cast<const char*>(at) - reinterpret_cast<const char*>(base),
                int64_t(stage) * Mainloop::kBytesB + i * Mainloop::kBoxRowsB * Mainloop::kTileK * 2);
    }
}

// sm100 K4: B (w2[e], (E, d, n)) is N-major. TMA box i (64 N columns x 64 k rows, 128-byte
// swizzle) writes element (n, k) of the box's block at byte k * 128 + 2 n % 128 with the 16-byte
// chunk bits XORed by the row's (k % 8); the box sits at 8 KB i. The UMMA layout must put every
// element there.
TEST(SmemLayouts, n_major_b_of_the_sm100_gather_mainloop) {
  using Mainloop = sonicmoe::sm100::VarlenGatherMainloop<128, 256, 64, 4, /*k_major_b=*/false>;
  Element* base = reinterpret_cast<Element*>(uintptr_t(1) << 20);
  auto sB = cute::make_tensor(cute::make_smem_ptr(base), typename Mainloop::SmemLayoutB{});
  for (int stage = 0; stage < 2; ++stage)
    for (int n = 0; n < Mainloop::kTileN; ++n)
      for (int k = 0; k < Mainloop::kTileK; ++k) {
        const int64_t in_box = int64_t(k) * 128 + (n % 64) * 2;
        const int64_t want = int64_t(stage) * Mainloop::kBytesB +
                             int64_t(n / Mainloop::kBoxRowsB) * Mainloop::kBoxRowsB * Mainloop::kTileK * 2 +
                             (in_box ^ (((in_box >> 7) & 7) << 4));
        const Element* at = cute::raw_pointer_cast(&sB(cute::make_coord(cute::make_coord(n, k % 16), 0, k / 16, stage)));
        ASSERT_EQ(reinterpret_cast<const char*>(at) - reinterpret_cast<const char*>(base), want)
            << "n " << n << " k " << k << " stage " << stage;
      }
}

// Varlen K: the copied operands are MN-major (column, sorted row, stage), 128 columns wide.
template <class Mainloop, class Layout>
void expect_copy_offsets_match(int columns) {
  ASSERT_EQ(columns, 128);
  const int64_t stage_bytes = int64_t(columns) * Mainloop::kTileK * sizeof(Element);
  for (int stage = 0; stage < 2; ++stage)
    for (int t = 0; t < Mainloop::kProducerThreads; ++t)
      for (int j = 0; j < Mainloop::kPasses; ++j) {
        const int row0 = t / Mainloop::kChunks, chunk = t % Mainloop::kChunks;
        const int64_t want = stage * stage_bytes + Mainloop::copy_offset(row0, chunk) + int64_t(j) * Mainloop::kPassBytes;
        ASSERT_EQ(byte_offset<Layout>(chunk * 8, row0 + j * Mainloop::kRowsPerPass, stage), want)
            << "thread " << t << " pass " << j << " stage " << stage;
      }
}

TEST(SmemLayouts, copy_offsets_of_the_varlen_k_mainloop) {
  using namespace sonicmoe::sm90;
  using Pingpong = VarlenKMainloop<128, 128, 64, 6, /*gather_a=*/true, /*tma_dense=*/false>;
  expect_copy_offsets_match<Pingpong, Pingpong::SmemLayoutA>(128);
  expect_copy_offsets_match<Pingpong, Pingpong::SmemLayoutB>(128);
  using Cooperative = VarlenKMainloop<128, 256, 64, 4, /*gather_a=*/true, /*tma_dense=*/true, /*consumers=*/2>;
  expect_copy_offsets_match<Cooperative, Cooperative::SmemLayoutA>(128);
}

// sm100 K5 / K7: both operands MN-major, element (column c, sorted row k) of a stage at UMMA
// coordinate ((c, k % 16), 0, k / 16, stage). The producers' chunks (A's 128 columns; B's 256 in
// the cp.async variant, two halves of 128) must land where CuTe puts every one of their 8
// elements, and B's TMA box i (64 columns x 64 rows, 128-byte swizzle) must sit at 8 KB i.
template <class Layout>
int64_t umma_mn_major_offset(int c, int k, int stage) {
  Element* base = reinterpret_cast<Element*>(uintptr_t(1) << 20);
  auto tensor = cute::make_tensor(cute::make_smem_ptr(base), Layout{});
  const Element* at = cute::raw_pointer_cast(&tensor(cute::make_coord(cute::make_coord(c, k % 16), 0, k / 16, stage)));
  return reinterpret_cast<const char*>(at) - reinterpret_cast<const char*>(base);
}

TEST(SmemLayouts, copy_offsets_and_boxes_of_the_sm100_varlen_k_mainloop) {
  using Mainloop = sonicmoe::sm100::VarlenKMainloop<128, 256, 64, 4, /*tma_dense=*/false>;
  using LayoutA = typename Mainloop::SmemLayoutA;
  using LayoutB = typename Mainloop::SmemLayoutB;
  for (int stage = 0; stage < Mainloop::kStages; ++stage)
    for (int t = 0; t < Mainloop::kGatherThreads; ++t)
      for (int j = 0; j < Mainloop::kPasses; ++j) {
        const int row0 = t / Mainloop::kChunks, chunk = t % Mainloop::kChunks;
        const int k = row0 + j * Mainloop::kRowsPerPass;
        const int64_t in_stage = Mainloop::copy_offset(row0, chunk) + int64_t(j) * Mainloop::kPassBytes;
        for (int e = 0; e < 8; ++e) {
          ASSERT_EQ(umma_mn_major_offset<LayoutA>(chunk * 8 + e, k, stage),
                    int64_t(stage) * Mainloop::kBytesA + in_stage + 2 * e)
              << "A: thread " << t << " pass " << j << " element " << e << " stage " << stage;
          for (int h = 0; h < Mainloop::kDenseHalves; ++h)
            ASSERT_EQ(umma_mn_major_offset<LayoutB>(h * Mainloop::kTileM + chunk * 8 + e, k, stage),
                      int64_t(stage) * Mainloop::kBytesB + in_stage + h * Mainloop::kHalfBytesB + 2 * e)
                << "B: thread " << t << " pass " << j << " half " << h << " element " << e << " stage " << stage;
        }
      }
  for (int stage = 0; stage < 2; ++stage)
    for (int c = 0; c < Mainloop::kTileN; ++c)
      for (int k = 0; k < Mainloop::kTileK; ++k) {
        const int64_t in_box = int64_t(k) * 128 + (c % Mainloop::kBoxCols) * 2;
        const int64_t want = int64_t(stage) * Mainloop::kBytesB +
                             int64_t(c / Mainloop::kBoxCols) * Mainloop::kBoxCols * Mainloop::kTileK * 2 +
                             (in_box ^ (((in_box >> 7) & 7) << 4));
        ASSERT_EQ(umma_mn_major_offset<LayoutB>(c, k, stage), want) << "box: c " << c << " k " << k;
      }
}

}  // namespace
