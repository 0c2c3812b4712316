"""K5 / K7 on the layer's tiles beside K6 (the same FLOPs as K7, both operands by TMA) at a few
configs: µs per call, medians of interleaved rounds, one line per config. For comparing kernel
libraries across processes (one build of the extension per library): K6 is the reference that
did not change, so read K5 / K6 and K7 / K6 of each process. With --k4: K4 (auto tile) beside K6
instead, K4 / K6.

    python experiments/k57_kernels.py [--k4] [CONFIG ...]
"""
import sys

import torch

sys.path.insert(0, "python")
sys.path.insert(0, "benchmarks")
import bench  # noqa: E402
from sonicmoe._ops import down_proj_grad, grouped_gemm_kn, weight_grad  # noqa: E402
from sonicmoe.functional import _weight_grad_tile  # noqa: E402

K4_ONLY = "--k4" in sys.argv[1:]
_, _, CONFIGS = bench.load_anchors()
bench.warm_up_gpu(1.0)
for name in [a for a in sys.argv[1:] if a != "--k4"] or ["olmoe-1b-7b", "paper-30b-n512", "qwen3-30b-a3b", "deepseek-v3"]:
    cfg = CONFIGS[name]
    E = cfg["E"]
    i = bench.backward_inputs(cfg)
    x, w1, w2, off, g, d_out, d_h, a_s = (i[k] for k in ("x", "w1", "w2", "off", "g", "d_out", "d_h", "a_scaled"))
    fns = {"K6": lambda: grouped_gemm_kn(d_h, w1, off)}
    if K4_ONLY:
        h, rs = i["h"], i["row_score"]
        fns["K4"] = lambda: down_proj_grad(d_out, w2, h, rs, off, g)
        line = lambda ms: f"K6 {ms['K6']*1e3:.0f} K4 {ms['K4']*1e3:.0f} | K4/K6 {ms['K4']/ms['K6']:.3f}"  # noqa: E731
    else:
        t5 = _weight_grad_tile(True, g.shape[0], E, w2[0].numel())
        t7 = _weight_grad_tile(False, g.shape[0], E, w1[0].numel())
        fns["K5"] = lambda: weight_grad(d_out, a_s, off, g, True, False, t5)
        fns["K7"] = lambda: weight_grad(d_h, x, off, g, False, False, t7)
        line = lambda ms: (f"K6 {ms['K6']*1e3:.0f} K5 {ms['K5']*1e3:.0f} ({t5}) K7 {ms['K7']*1e3:.0f} ({t7}) | "  # noqa: E731
                           f"K5/K6 {ms['K5']/ms['K6']:.3f} K7/K6 {ms['K7']/ms['K6']:.3f}")
    ms = bench.time_interleaved(fns, rounds=5, iters=20)
    print(f"{name}: {line(ms)}", flush=True)
    del i, x, w1, w2, d_out, d_h, a_s, fns
    torch.cuda.empty_cache()
