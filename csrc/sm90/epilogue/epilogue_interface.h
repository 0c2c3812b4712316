// The interface VarlenGemmKernel (sm90/varlen_gemm_kernel_sm90.cuh) expects of an epilogue, written
// once here; the epilogues of this directory implement it, one per file.
//
// Required (every epilogue):
//   Params                 trivially copyable: it travels in the kernel's __grid_constant__
//                          Params (Kernel::Params::epilogue); the launchers fill it on the host.
//   Tile                   EpilogueTile<kTileM, kTileN> (epilogue_tile_sm90.cuh); its SmemTile is
//                          the warpgroup's shared memory unless the epilogue names its own.
//   static __host__ __device__ int n_blocks(const Params&)
//                          n tiles of an expert's output: the scheduler's n extent on the device,
//                          the grid's size on the host (launch_varlen_gemm, launch_varlen_k_gemm).
//   static __device__ cute::array<int, Mainloop::kBoxesB> b_rows(const Params&, const VarlenTile&)
//                          the weight row where each B box of the tile starts, handed by the
//                          producer warpgroup to Mainloop::load (SwiGLU pairs gate and up boxes
//                          there). The varlen-K mainloop ignores it (TmaStoreEpilogue: array<int, 1>).
//   template <class Accumulator, class Coords>
//   static __device__ void store(const Params&, Smem smem, const Accumulator& accum,
//                                const Coords& coords, const VarlenTile& tile, int thread_idx,
//                                int barrier_id)
//                          called by each consumer warpgroup after its mainloop, once per tile
//                          it owns. Smem is Element* (the staging tile, an array that decays) or
//                          SmemTile& (an epilogue's own); accum and coords are the thread's
//                          partition of the (kTileM, kTileN) accumulator and its identity tensor;
//                          thread_idx is within the warpgroup (0..127); barrier_id (0 or 1, the
//                          consumer) names the warpgroup's own 128-thread named barrier.
//
// Optional, found by the probes below (SFINAE on a member's presence):
//   SmemTile               EpilogueSmemOf: the epilogue's own per-warpgroup shared memory, two
//                          of them in the kernel's SharedStorage (one per consumer), aligned to
//                          its alignof; absent: Tile::SmemTile (the 64 x 128 staging window).
//   init_source(const Params&, SmemTile (&)[2])
//                          LoadsSource looks for this name, as `&Epilogue::init_source` (so it must
//                          be one non-template, non-overloaded static function). Present: thread 0
//                          of the CTA calls it before the mainloop's barrier-init fence (barrier
//                          init, descriptor prefetch), and each consumer warpgroup calls
//                          template <class Coords> static __device__ void load_source(const Params&,
//                              SmemTile&, const VarlenTile&, const Coords&, int thread_idx)
//                          as it starts a tile's mainloop, so a source (K4's H by TMA, K6's
//                          addend by cp.async) is in flight behind the MMAs. load_source is not
//                          probed itself: init_source implies it.
//   finish(int thread_idx) HasFinish looks for `&Epilogue::finish`. Present: each consumer
//                          warpgroup calls it after its last tile (TMA stores still in flight
//                          must have read shared memory before the CTA exits).
#pragma once

#include <type_traits>
#include <utility>

#include "common/varlen_tile_scheduler.cuh"

namespace sonicmoe::sm90 {

// The epilogue's shared memory per consumer warpgroup: its own SmemTile where it has one (an
// epilogue source by TMA: K4's H), else the staging tile of its EpilogueTile.
template <class Epilogue, class = void>
struct EpilogueSmemOf {
  using type = typename Epilogue::Tile::SmemTile;
};
template <class Epilogue>
struct EpilogueSmemOf<Epilogue, std::void_t<typename Epilogue::SmemTile>> {
  using type = typename Epilogue::SmemTile;
};

// Whether the epilogue reads a source by TMA into its SmemTile (load_source, init_source).
template <class Epilogue, class = void>
struct LoadsSource : std::false_type {};
template <class Epilogue>
struct LoadsSource<Epilogue, std::void_t<decltype(&Epilogue::init_source)>> : std::true_type {};

// Whether the epilogue has work after a consumer's last tile (finish: TMA stores in flight).
template <class Epilogue, class = void>
struct HasFinish : std::false_type {};
template <class Epilogue>
struct HasFinish<Epilogue, std::void_t<decltype(&Epilogue::finish)>> : std::true_type {};

// Whether the epilogue names its own SmemTile (EpilogueSmemOf's first choice).
template <class Epilogue, class = void>
struct HasOwnSmemTile : std::false_type {};
template <class Epilogue>
struct HasOwnSmemTile<Epilogue, std::void_t<typename Epilogue::SmemTile>> : std::true_type {};

// The parts of the interface a type check can see (store and load_source are templates over the
// kernel's accumulator and coordinate tensors, checked where the kernel calls them). Evaluated
// only in unevaluated contexts: no device code is instantiated.
template <class Epilogue>
constexpr bool check_epilogue_interface() {
  using Params = typename Epilogue::Params;
  static_assert(std::is_trivially_copyable_v<Params>, "Epilogue::Params travels in the kernel's grid constant");
  static_assert(std::is_same_v<decltype(Epilogue::n_blocks(std::declval<const Params&>())), int>,
                "Epilogue::n_blocks(const Params&) returns the n tiles of an expert as int");
  using BRows = decltype(Epilogue::b_rows(std::declval<const Params&>(), std::declval<const VarlenTile&>()));
  static_assert(sizeof(BRows) > 0, "Epilogue::b_rows(const Params&, const VarlenTile&) gives the B box origins");
  static_assert(!LoadsSource<Epilogue>::value || HasOwnSmemTile<Epilogue>::value,
                "an epilogue with init_source loads its source into its own SmemTile");
  return true;
}

}  // namespace sonicmoe::sm90
