"""Does the gathered source's allocation set the varlen-K kernel's energy (session 30)? K7's
operands in K5's shape (gathered src (T, d), dense dH) with the source in different allocations
of the same values: x, dO, clones, a fresh one after empty_cache, and views into a 1 GiB buffer.

    python experiments/gathered_source_placement.py olmoe-1b-7b [reverse]   (reverse: dO allocated first)
"""
import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "benchmarks")]
import bench  # noqa: E402
from sonicmoe._ops import weight_grad  # noqa: E402

_, _, CONFIGS = bench.load_anchors()
bench.warm_up_gpu()
name, reverse = sys.argv[1], sys.argv[2:] == ["reverse"]
cfg = CONFIGS[name]
T, d = cfg["T"], cfg["d"]
early = torch.randn(T, d, device="cuda").bfloat16() if reverse else None
i = bench.backward_inputs(cfg)
x, off, g, d_h = i["x"], i["off"], i["g"], i["d_h"]
d_out = early if reverse else i["d_out"]
srcs = {"x": x, "d_out": d_out, "x.clone": x.clone(), "d_out.clone": d_out.clone()}
torch.cuda.empty_cache()
srcs["x fresh"] = x.clone()
big = torch.empty(1 << 29, device="cuda", dtype=torch.bfloat16)  # 1 GiB
for off_mb in (512, 514, 640):
    view = big[off_mb << 19: (off_mb << 19) + T * d].view(T, d)
    view.copy_(x)
    srcs[f"1GiB+{off_mb}MB"] = view
flops = 4.0 * T * cfg["K"] * d * cfg["n"]
fns = {k: (lambda s=s: weight_grad(s, d_h, off, g, True)) for k, s in srcs.items()}
ms = bench.time_interleaved(fns, rounds=3, iters=10)
power = bench.energy_interleaved(fns, ms)
print(f"== {name} ({'dO' if reverse else 'x'} allocated first)")
print(f"{'source':<14}{'ptr % 1GiB (MB)':>16}{'us':>8}{'TF':>8}{'W':>7}{'MHz':>7}{'pJ/F':>7}")
for k, s in srcs.items():
    watts, mhz = power[k]
    print(f"{k:<14}{(s.data_ptr() % (1 << 30)) / (1 << 20):>16.1f}{ms[k] * 1e3:>8.0f}{flops / ms[k] / 1e9:>8.1f}"
          f"{watts:>7.0f}{mhz:>7.0f}{watts * ms[k] * 1e9 / flops:>7.3f}")
