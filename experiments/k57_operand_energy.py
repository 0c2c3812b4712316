"""K5 / K7's energy per FLOP on permuted operands (session 30): the varlen-K kernel with K5's
operands, random dense values, a dense operand as wide as dH, x or dO gathered, and K7 itself
(transposed store), beside K6; time and the card's power as bench.py --energy reads them.

    python experiments/k57_operand_energy.py olmoe-1b-7b,qwen3-30b-a3b
"""
import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "benchmarks")]
import bench  # noqa: E402
from sonicmoe._ops import grouped_gemm_kn, weight_grad  # noqa: E402

_, _, CONFIGS = bench.load_anchors()
bench.warm_up_gpu()
for name in sys.argv[1].split(","):
    cfg = CONFIGS[name]
    gemm = 2.0 * cfg["T"] * cfg["K"] * cfg["d"] * cfg["n"]
    i = bench.backward_inputs(cfg)
    x, off, g, d_out, d_h, a_scaled = i["x"], i["off"], i["g"], i["d_out"], i["d_h"], i["a_scaled"]
    rand_a = torch.randn_like(a_scaled) * float(a_scaled.float().std())
    rand_dh = torch.randn_like(d_h) * float(d_h.float().std())
    fns = {
        "K5": (lambda: weight_grad(d_out, a_scaled, off, g, True), gemm),
        "K5_rand_dense": (lambda: weight_grad(d_out, rand_a, off, g, True), gemm),
        "K5_dense_dh": (lambda: weight_grad(d_out, d_h, off, g, True), 2 * gemm),
        "K5_x_dh": (lambda: weight_grad(x, d_h, off, g, True), 2 * gemm),
        "K7": (lambda: weight_grad(d_h, x, off, g, False), 2 * gemm),
        "K7_rand_dh": (lambda: weight_grad(rand_dh, x, off, g, False), 2 * gemm),
        "K6": (lambda: grouped_gemm_kn(d_h, i["w1"], off), 2 * gemm),
    }
    callables = {k: f for k, (f, _) in fns.items()}
    ms = bench.time_interleaved(callables, rounds=3, iters=10)
    power = bench.energy_interleaved(callables, ms)
    print(f"== {name}\n{'part':<16}{'us':>8}{'TF':>8}{'W':>7}{'MHz':>7}{'pJ/F':>7}")
    for k, (_, flops) in fns.items():
        watts, mhz = power[k]
        print(f"{k:<16}{ms[k] * 1e3:>8.0f}{flops / ms[k] / 1e9:>8.1f}{watts:>7.0f}{mhz:>7.0f}"
              f"{watts * ms[k] * 1e9 / flops:>7.3f}")
    del fns, callables, rand_a, rand_dh, i
    torch.cuda.empty_cache()
