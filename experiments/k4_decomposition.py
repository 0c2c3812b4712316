"""Writes K4 variants that each drop one part of a dSwiGLU epilogue, to time against the full
kernel with scripts/ab_variants.sh and see where K4's time goes (docs/perf-notes.md, sessions 9
and 21). Two epilogues, two sets:

  pp_*  the register path (DSwiGLUEpilogue: H by 16-byte global loads), K4's ping-pong tile
  co_*  the shared-memory path (DSwiGLUSmemSourceEpilogue: H by TMA), the cooperative 128 x 256
        tiles auto takes at d >= 2048 where n % 256 == 0

  nostore   no dH / A' stores (the results feed dS instead, so their math stays)
  noload    no H loads (gate and up come from the accumulator; the transposes stay; co_: no TMA
            either)
  noepi     neither loads nor stores: only the epilogue's math and the dS store
  mainonly  the mainloop alone: the epilogue only sums the accumulator into dS (co_: no TMA)

The outputs are wrong by design: a diagnostic, never built into the product. Each variant is a
folder holding the changed header at its path in the tree:

  python3 experiments/k4_decomposition.py .carry/k4diag        # here
  ROUNDS=1 bash scripts/ab_variants.sh \\
    "python3 benchmarks/bench.py --ops backward_kernels --parts K4_pp,K4_co_n256,K6_pp,K6_co_n256" \\
    .carry/k4diag/co_mainonly .carry/k4diag/co_noepi ...      # on the H200

The replacements are matched against the current epilogue text and fail loudly when it changed.
"""
import pathlib
import sys

HEADER = "csrc/sm90/fusion/varlen_epilogue_sm90.cuh"
ROOT = pathlib.Path(__file__).resolve().parent.parent

# The register path (DSwiGLUEpilogue).
PP_LOADS = """            load_16B(g4[q], p.h + row * h_pitch + col, ok);
            load_16B(u4[q], p.h + row * h_pitch + p.n + col, ok);"""
PP_LOADS_FROM_ACCUM = """            CUTLASS_PRAGMA_UNROLL
            for (int b = 0; b < 4; ++b) {
              g4[q][b] = ok ? pack_bf16x2(accum(make_coord(make_coord(0, v1, j0 + 4 * q + b), m, 0)), 1.f) : 0u;
              u4[q][b] = ok ? pack_bf16x2(accum(make_coord(make_coord(1, v1, j0 + 4 * q + b), m, 0)), 0.5f) : 0u;
            }"""
PP_STORES = """              store_16B(d_h_row + col, dg4);
              store_16B(d_h_row + p.n + col, du4);
              store_16B(p.a_scaled + row * p.n + col, as4);"""
PP_INTO_DS = """              d_score += 0.f * __uint_as_float(dg4[0] ^ dg4[1] ^ dg4[2] ^ dg4[3] ^ du4[0] ^ du4[1] ^ du4[2] ^ du4[3] ^
                                               as4[0] ^ as4[1] ^ as4[2] ^ as4[3]);
              (void)d_h_row;"""
PP_BATCH_START = "          // H as 16-byte chunks: lane l of a quad loads chunk l of each 32-column block, its own"
PP_BATCH_END = "          if ((j0 + kBatch) % kSlotGroups == 0) {"
PP_ACCUM_SUMS = """          CUTLASS_PRAGMA_UNROLL
          for (int j = j0; j < j0 + kBatch; ++j)
            d_score += score * (accum(make_coord(make_coord(0, v1, j), m, 0)) +
                                accum(make_coord(make_coord(1, v1, j), m, 0)));
"""

# The shared-memory path (DSwiGLUSmemSourceEpilogue).
CO_ISSUE = """    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&s.full, kQuarterBytes);
    cute::SM90_TMA_LOAD_2D::copy(&p.tma_h, &s.full, kCacheHint, s.gate, col, row);
    cute::SM90_TMA_LOAD_2D::copy(&p.tma_h, &s.full, kCacheHint, s.up, p.n + col, row);"""
CO_NO_ISSUE = """    (void)kCacheHint, (void)col, (void)row;"""
CO_WAIT = """      cutlass::arch::ClusterBarrier::wait(&s.full, q % 2);
"""
CO_LOADS = """          load_shared_16B(g4, gate_base + offset);
          load_shared_16B(u4, up_base + offset);"""
CO_LOADS_FROM_ACCUM = """          CUTLASS_PRAGMA_UNROLL
          for (int b = 0; b < 4; ++b) {
            g4[b] = pack_bf16x2(accum(make_coord(make_coord(0, v1, j0 + b), 0, 0)), 1.f);
            u4[b] = pack_bf16x2(accum(make_coord(make_coord(1, v1, j0 + b), 0, 0)), 0.5f);
          }
          (void)offset, (void)gate_base, (void)up_base;"""
CO_STORES = """            store_16B(d_h_row + col, dg4);
            store_16B(d_h_row + p.n + col, du4);
            store_16B(p.a_scaled + row * p.n + col, as4);"""
CO_INTO_DS = """            d_score[v1] += 0.f * __uint_as_float(dg4[0] ^ dg4[1] ^ dg4[2] ^ dg4[3] ^ du4[0] ^ du4[1] ^ du4[2] ^
                                                   du4[3] ^ as4[0] ^ as4[1] ^ as4[2] ^ as4[3]);
            (void)d_h_row;"""
CO_BODY_START = "          uint32_t g4[4], u4[4];\n          load_shared_16B(g4, gate_base + offset);"
CO_BODY_END = "        if ((q + 1) % kSlotQuarters == 0) {"
CO_ACCUM_SUMS = """          CUTLASS_PRAGMA_UNROLL
          for (int j = j0; j < j0 + 4; ++j)
            d_score[v1] += score[v1] * (accum(make_coord(make_coord(0, v1, j), 0, 0)) +
                                        accum(make_coord(make_coord(1, v1, j), 0, 0)));
          (void)offset, (void)gate_base, (void)up_base, (void)h_pitch;
        }
"""


def replace(text, old, new):
    if text.count(old) != 1:
        sys.exit(f"{HEADER}: the text to replace is not there once (the epilogue changed?):\n{old}")
    return text.replace(old, new)


def cut(text, start, end, new):
    """text with [start, end) replaced by new; start and end each once in text."""
    for marker in (start, end):
        if text.count(marker) != 1:
            sys.exit(f"{HEADER}: the marker is not there once (the epilogue changed?):\n{marker}")
    i, j = text.index(start), text.index(end)
    return text[:i] + new + text[j:]


def co_no_h(text):
    """No H by TMA: nothing asked for, nothing waited on."""
    return replace(replace(text, CO_ISSUE, CO_NO_ISSUE), CO_WAIT, "")


def variants(text):
    return {
        "pp_nostore": replace(text, PP_STORES, PP_INTO_DS),
        "pp_noload": replace(text, PP_LOADS, PP_LOADS_FROM_ACCUM),
        "pp_noepi": replace(replace(text, PP_STORES, PP_INTO_DS), PP_LOADS, PP_LOADS_FROM_ACCUM),
        "pp_mainonly": cut(text, PP_BATCH_START, PP_BATCH_END, PP_ACCUM_SUMS),
        "co_nostore": replace(text, CO_STORES, CO_INTO_DS),
        "co_noload": co_no_h(replace(text, CO_LOADS, CO_LOADS_FROM_ACCUM)),
        "co_noepi": co_no_h(replace(replace(text, CO_STORES, CO_INTO_DS), CO_LOADS, CO_LOADS_FROM_ACCUM)),
        "co_mainonly": co_no_h(cut(text, CO_BODY_START, CO_BODY_END, CO_ACCUM_SUMS)),
    }


def main():
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUT_DIR")
    out = pathlib.Path(sys.argv[1])
    for name, text in variants((ROOT / HEADER).read_text()).items():
        path = out / name / HEADER
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(path)


if __name__ == "__main__":
    main()
