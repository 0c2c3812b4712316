"""Probe: how much of K4's and K5's time is the gather of dO's rows, against the same kernels
reading dO already in the sorted rows' order (dO[gather_idx] copied once; the kernels then
"gather" with gather_idx = arange, so their cp.async loads walk contiguous rows). The copy's own
time is printed beside. A probe, not a layer change: if K4 on the ping-pong tile (its epilogue
hidden under the other warpgroup's mainloop) ran near K6's rate on sorted rows, a layer that
copies dO once for K4 and K5 could beat the gathered cooperative K4 (docs/perf-notes.md,
session 48).

    python experiments/sorted_dout_probe.py [--rounds 3] [CONFIG ...]
"""
import argparse
import statistics
import sys

import torch

sys.path.insert(0, "python")
sys.path.insert(0, "benchmarks")
import bench  # noqa: E402
from sonicmoe._ops import down_proj_grad, weight_grad  # noqa: E402

DEFAULT = ["olmoe-1b-7b", "paper-30b-n512", "qwen3-30b-a3b"]
PP = "varlen_pingpong_128x128x64"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("configs", nargs="*")
    args = parser.parse_args()
    _, _, configs = bench.load_anchors()
    bench.warm_up_gpu()
    for name in args.configs or DEFAULT:
        cfg = configs[name]
        i = bench.backward_inputs(cfg)
        d_out, w2, h, s, off, g, a_scaled = (i[k] for k in ("d_out", "w2", "h", "row_score", "off", "g", "a_scaled"))
        rows = torch.arange(g.numel(), device="cuda", dtype=torch.int32)
        d_sorted = d_out.index_select(0, g.long())
        # Same results either way (the kernels read the same rows): checked once.
        want = down_proj_grad(d_out, w2, h, s, off, g, tile_config=PP)
        got = down_proj_grad(d_sorted, w2, h, s, off, rows, tile_config=PP)
        assert all(torch.equal(a, b) for a, b in zip(want, got)), "sorted rows changed K4's results"
        fns = {
            "copy dO[g]": lambda: d_out.index_select(0, g.long()),
            "K4 auto": lambda: down_proj_grad(d_out, w2, h, s, off, g),
            "K4 auto sorted": lambda: down_proj_grad(d_sorted, w2, h, s, off, rows),
            "K4 pp": lambda: down_proj_grad(d_out, w2, h, s, off, g, tile_config=PP),
            "K4 pp sorted": lambda: down_proj_grad(d_sorted, w2, h, s, off, rows, tile_config=PP),
            "K5 auto": lambda: weight_grad(d_out, a_scaled, off, g, True),
            "K5 auto sorted": lambda: weight_grad(d_sorted, a_scaled, off, rows, True),
        }
        times = {k: [] for k in fns}
        for r in range(args.rounds):
            for k in bench.rotated(list(fns), r):
                times[k].append(bench.time_ms(fns[k]) * 1e3)
        print(f"== {name} (µs, median of {args.rounds}; rounds)", flush=True)
        for k, t in times.items():
            print(f"  {k:<16}{statistics.median(t):9.0f}   " + " ".join(f"{x:.0f}" for x in t), flush=True)
        del i, d_sorted
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
