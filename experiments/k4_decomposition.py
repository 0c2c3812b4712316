"""Writes K4 variants that each drop one part of the dSwiGLU epilogue, to time against the full
kernel with scripts/ab_patch.sh and see where K4's time goes (docs/perf-notes.md, session 9):

  nostore   no dH / A' stores (the results feed dS instead, so their math stays)
  noload    no H loads (gate and up come from the accumulator; the transpose stays)
  noepi     neither loads nor stores: only the epilogue's math and the dS store
  mainonly  the mainloop alone: each batch of the epilogue only sums the accumulator into dS

The outputs are wrong by design: a diagnostic, never built into the product. Each variant is a
folder holding the changed header at its path in the tree:

  python3 experiments/k4_decomposition.py .carry/k4diag        # here
  for v in nostore noload noepi mainonly; do                    # on the H200
    ROUNDS=1 bash scripts/ab_patch.sh .carry/k4diag/$v \\
      "python3 benchmarks/bench.py --ops backward_kernels --parts K4_down_proj_grad,K6_grouped_gemm_kn"
  done

The replacements are matched against the current epilogue text and fail loudly when it changed.
"""
import pathlib
import sys

HEADER = "csrc/sm90/fusion/varlen_epilogue_sm90.cuh"
ROOT = pathlib.Path(__file__).resolve().parent.parent

H_LOADS = """            load_16B(g4[q], p.h + row * h_pitch + col, ok);
            load_16B(u4[q], p.h + row * h_pitch + p.n + col, ok);"""
H_FROM_ACCUM = """            CUTLASS_PRAGMA_UNROLL
            for (int b = 0; b < 4; ++b) {
              g4[q][b] = ok ? pack_bf16x2(accum(make_coord(make_coord(0, v1, j0 + 4 * q + b), m, 0)), 1.f) : 0u;
              u4[q][b] = ok ? pack_bf16x2(accum(make_coord(make_coord(1, v1, j0 + 4 * q + b), m, 0)), 0.5f) : 0u;
            }"""
STORES = """              store_16B(d_h_row + col, dg4);
              store_16B(d_h_row + p.n + col, du4);
              store_16B(p.a_scaled + row * p.n + col, as4);"""
INTO_DS = """              d_score += 0.f * __uint_as_float(dg4[0] ^ dg4[1] ^ dg4[2] ^ dg4[3] ^ du4[0] ^ du4[1] ^ du4[2] ^ du4[3] ^
                                               as4[0] ^ as4[1] ^ as4[2] ^ as4[3]);"""
BATCH_START = "          // H as 16-byte chunks, the stores' transpose in reverse"
BATCH_END = "          if ((j0 + kBatch) % kSlotGroups == 0) {"
ACCUM_SUMS = """          CUTLASS_PRAGMA_UNROLL
          for (int j = j0; j < j0 + kBatch; ++j)
            d_score += score * (accum(make_coord(make_coord(0, v1, j), m, 0)) +
                                accum(make_coord(make_coord(1, v1, j), m, 0)));
"""


def replace(text, old, new):
    if text.count(old) != 1:
        sys.exit(f"{HEADER}: the text to replace is not there once (the epilogue changed?):\n{old}")
    return text.replace(old, new)


def variants(text):
    start, end = text.index(BATCH_START), text.index(BATCH_END)
    return {
        "nostore": replace(text, STORES, INTO_DS),
        "noload": replace(text, H_LOADS, H_FROM_ACCUM),
        "noepi": replace(replace(text, STORES, INTO_DS), H_LOADS, H_FROM_ACCUM),
        "mainonly": text[:start] + ACCUM_SUMS + text[end:],
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
