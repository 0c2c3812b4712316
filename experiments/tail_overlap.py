"""Probe: how much of the backward's time is the persistent GEMMs' last, partly idle wave?

K5 (dW2), K6 (dX~) and K7 (dW1) all depend on K4 only, so one could start on the SMs that the
previous one's last tiles leave idle (a static round-robin schedule ends with a partial wave:
at olmoe-1b-7b K5's 2048 tile pairs over 66 clusters are 31 whole rounds and 2 pairs). Timed
here: each kernel alone, the three back to back on one stream (the layer's order), and the same
with K5 on a second stream launched right after K6, so that its CTAs fill the SMs K6 frees (and
K7's those K5 frees), which is what a programmatic dependent launch would give in one stream.
Both as bench.py's back-to-back medians and in the anchors' protocol (a window after idle).

    python experiments/tail_overlap.py [CONFIG ...]
"""
import statistics
import sys

import torch

sys.path.insert(0, "python")
sys.path.insert(0, "benchmarks")
import bench  # noqa: E402
from sonicmoe._ops import grouped_gemm_kn, weight_grad  # noqa: E402
from sonicmoe.functional import _weight_grad_tile  # noqa: E402

_, _, CONFIGS = bench.load_anchors()
names = sys.argv[1:] or ["olmoe-1b-7b", "paper-30b-n512", "qwen3-30b-a3b", "deepseek-v3"]
bench.warm_up_gpu(1.0)
for name in names:
    cfg = CONFIGS[name]
    T, d, n, E, K = (cfg[k] for k in ("T", "d", "n", "E", "K"))
    i = bench.backward_inputs(cfg)
    x, w1, w2, off, g, d_out, d_h, a_s = (i[k] for k in ("x", "w1", "w2", "off", "g", "d_out", "d_h", "a_scaled"))
    rows = g.shape[0]
    t5 = _weight_grad_tile(True, rows, E, w2[0].numel())
    t7 = _weight_grad_tile(False, rows, E, w1[0].numel())
    k6 = lambda: grouped_gemm_kn(d_h, w1, off)  # noqa: E731
    k5 = lambda: weight_grad(d_out, a_s, off, g, True, False, t5)  # noqa: E731
    k7 = lambda: weight_grad(d_h, x, off, g, False, False, t7)  # noqa: E731
    side = torch.cuda.Stream()

    def seq():
        k6(); k5(); k7()

    def two_streams():
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        k6()
        with torch.cuda.stream(side):
            k5()
        k7()
        main.wait_stream(side)

    fns = {"K6": k6, "K5": k5, "K7": k7, "seq": seq, "two_streams": two_streams}
    ms = bench.time_interleaved(fns, rounds=7, iters=20)
    prot = bench.anchor_protocol_interleaved({"seq": seq, "two_streams": two_streams}, rounds=2)
    s = ms["K6"] + ms["K5"] + ms["K7"]
    print(f"{name}: K6 {ms['K6']*1e3:.0f} K5 {ms['K5']*1e3:.0f} K7 {ms['K7']*1e3:.0f} sum {s*1e3:.0f} | "
          f"seq {ms['seq']*1e3:.0f} two_streams {ms['two_streams']*1e3:.0f} µs "
          f"({(ms['seq'] - ms['two_streams'])*1e3:+.0f}) | protocol seq {prot['seq']*1e3:.0f} "
          f"two_streams {prot['two_streams']*1e3:.0f} ({(prot['seq'] - prot['two_streams'])*1e3:+.0f})", flush=True)
    del i, x, w1, w2, d_out, d_h, a_s
    torch.cuda.empty_cache()
