"""Kernel list of sonicmoe.moe's training step under sustained load, against one isolated step.

bench.py's layer figures come from steps queued back to back, where the card sits at its power
cap (~700 W) and lowers its clock; a kernel timed alone, or in one isolated step, runs at a
higher clock. This script runs the step (gradients unset, forward + backward) back to back for a
few seconds, then profiles STEPS more of them in one queue, and prints every kernel's median
duration in those steps beside its duration in one step run after the card idled a second:
the kernels that stretch the most under the cap are the ones whose energy the step pays for.
With --impls project,upstream it does the same for upstream SonicMoE's layer (sidebyside.py's
steps, one impl after the other per config), so the two layers' kernels compare under the cap
and not only one call each (sidebyside.py PROFILE=1).

    python benchmarks/profile_sustained.py [--steps N] [--warm SECONDS] [--impls project,upstream] [CONFIG ...]
"""
import argparse
import re
import statistics
import sys
import time

import torch
sys.path.insert(0, "python")  # run from the repository root
sys.path.insert(0, "benchmarks")
from bench import cuda_events, load_anchors
from sidebyside import IMPLS, UPSTREAM_HOWTO, upstream_available

_, _, CONFIGS = load_anchors()
DEFAULT = ["paper-30b-n512", "qwen3-235b-a22b", "olmoe-1b-7b", "qwen3-30b-a3b", "paper-120b-n1024"]


def short(name):
    """A kernel's name without namespaces; template arguments are kept (they tell the varlen
    kernels apart: mainloop and epilogue), function parameters dropped."""
    name = re.sub(r"\(anonymous namespace\)::|\b\w+::", "", name.replace("void ", ""))
    if "<" not in name:
        name = name.split("(")[0]
    return name[:110]


def by_kernel(events):
    """{(name, k): µs} of one step's kernels: the k-th launch of each kernel name. With the tail on
    a second stream, a step's kernels in start order interleave differently from step to step, so
    they are matched by name and occurrence, not by position."""
    seen, times = {}, {}
    for e in events:
        k = seen.get(e.name, 0)
        seen[e.name] = k + 1
        times[(e.name, k)] = e.device_time
    return times


def kernel_rows(isolated, sustained_steps):
    """(isolated µs, sustained median µs, name) for each kernel of the isolated step, in its start
    order; None if a sustained step launched a different set of kernels."""
    steps = [by_kernel(events) for events in sustained_steps]
    iso = by_kernel(isolated)
    if any(step.keys() != iso.keys() for step in steps):
        return None
    return [(t, statistics.median(step[key] for step in steps), key[0]) for key, t in iso.items()]


def impls_arg(text):
    """--impls: layers of sidebyside.IMPLS, upstream left out (with how to get it) where not importable."""
    impls = [i for i in text.split(",") if i]
    unknown = [i for i in impls if i not in IMPLS]
    if unknown or not impls:
        raise SystemExit(f"--impls {text!r}: each must be one of {sorted(IMPLS)}")
    if "upstream" in impls and not upstream_available():
        print(UPSTREAM_HOWTO + "; profiling " + (", ".join(i for i in impls if i != "upstream") or "nothing"))
        impls = [i for i in impls if i != "upstream"]
    return impls


def profile(label, step, steps, warm, flops):
    """Prints step's kernels isolated (one step after a second idle) and sustained (the median over
    `steps` back-to-back steps after `warm` seconds of them)."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    time.sleep(1.0)
    isolated = cuda_events(step)
    per_step = len(isolated)
    start = time.time()
    while time.time() - start < warm:
        for _ in range(4):
            step()
        torch.cuda.synchronize()
    sustained = cuda_events(lambda: [step() for _ in range(steps)])
    per_step_events = [sustained[s * per_step:(s + 1) * per_step] for s in range(steps)]
    rows = kernel_rows(isolated, per_step_events) if len(sustained) == per_step * steps else None
    if rows is None:
        print(f"== {label}: {len(sustained)} events in {steps} steps, {per_step} in one: "
              "the steps differ, no per-kernel table")
        return
    # A step ends with its last kernel to finish: on two streams not always the last to start.
    spans = [max(e.time_range.end for e in per_step_events[s]) - per_step_events[s][0].time_range.start
             for s in range(steps - 1)]
    iso_sum, sus_sum = sum(r[0] for r in rows), sum(r[1] for r in rows)
    print(f"== {label}: {per_step} kernels per step; kernel time isolated {iso_sum / 1e3:.3f} ms, "
          f"sustained {sus_sum / 1e3:.3f} ms ({sus_sum / iso_sum:.3f}x); sustained step span median "
          f"{statistics.median(spans) / 1e3:.3f} ms ({flops / statistics.median(spans) / 1e6:.1f} TF fwd+bwd)")  # spans in µs
    print(f"  {'isolated us':>11} {'sustained':>10} {'ratio':>6} {'share':>6}  kernel")
    for iso, sus, kname in rows:
        print(f"  {iso:11.1f} {sus:10.1f} {sus / iso:6.3f} {sus / sus_sum:6.3f}  {short(kname)}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warm", type=float, default=3.0, help="seconds of back-to-back steps first")
    parser.add_argument("--impls", default="project", help="comma-separated layers of sidebyside.py: project "
                        "(sonicmoe.moe), upstream (upstream SonicMoE), torch (the torch._grouped_mm layer)")
    parser.add_argument("configs", nargs="*")
    args = parser.parse_args()
    impls = impls_arg(args.impls)
    for name in args.configs or DEFAULT:
        T, d, n, E, K = (CONFIGS[name][k] for k in ("T", "d", "n", "E", "K"))
        for impl in impls:
            # sidebyside.py's training step: forward + backward of the same shapes and routing, gradients unset.
            profile(f"{name} {impl}", IMPLS[impl](T, d, n, E, K)[1], args.steps, args.warm, 18.0 * T * K * d * n)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
