"""Kernel list of one sonicmoe.moe backward on the GPU (torch profiler; gradients unset first, as
optimizer.zero_grad leaves them), per config: where the backward's time goes.

It also prints the backward's span on the GPU (first kernel start to last kernel end) against the
kernels' summed time, the largest idle gaps between consecutive kernels, and CUDA-event times of
the backward alone and of bench.py's step (forward + backward) less the forward, which is how
bench.py's moe_backward column is made.

    python benchmarks/profile_backward.py [CONFIG ...]

CONFIG: anchor config names; by default the five where the backward trails upstream's.
"""
import statistics
import sys
import warnings

import torch
sys.path.insert(0, "python")  # run from the repository root
sys.path.insert(0, "benchmarks")
import sonicmoe
from bench import cuda_events, layer_params, load_anchors

_, _, CONFIGS = load_anchors()
DEFAULT = ["paper-30b-n512", "qwen3-235b-a22b", "olmoe-1b-7b", "qwen3-30b-a3b", "paper-120b-n1024"]


def events_ms(fn, before=None, iters=10):
    """Median CUDA-event time of fn (ms); before() runs untimed ahead of each call."""
    times = []
    for _ in range(iters + 2):
        arg = before() if before else None
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(arg)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times[2:])


for name in sys.argv[1:] or DEFAULT:
    T, d, n, E, K = (CONFIGS[name][k] for k in ("T", "d", "n", "E", "K"))
    x, router, w1, w2 = layer_params(T, d, n, E)
    grad = torch.randn(T, d, device="cuda").bfloat16()
    params = (x, router, w1, w2)

    def unset():
        for t in params:
            t.grad = None

    def forward(_=None):
        return sonicmoe.moe(x, router, w1, w2, K)

    def step(_=None):
        unset()
        forward().backward(grad)

    def fresh_forward():
        unset()
        out = forward()
        torch.cuda.synchronize()
        return out

    for _ in range(3):
        step()
    with warnings.catch_warnings(record=True) as caught:  # any host sync in a step (the debug mode warns)
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        step()
        torch.cuda.set_sync_debug_mode("default")
    # The debug mode's own notice ("... is a prototype feature ...") is not a sync.
    syncs = [str(w.message).splitlines()[0][:100] for w in caught if "prototype feature" not in str(w.message)]
    print(f"== {name}: {len(syncs)} synchronizing calls in a step{': ' if syncs else ''}{'; '.join(syncs[:4])}")
    bwd_alone = events_ms(lambda out: out.backward(grad), before=fresh_forward)
    fwd_ms, step_ms = events_ms(forward), events_ms(step)
    flops = 12.0 * T * K * d * n
    out = fresh_forward()
    events = cuda_events(lambda: out.backward(grad))
    total = sum(e.device_time for e in events)
    span = events[-1].time_range.end - events[0].time_range.start
    print(f"== {name} backward: {len(events)} kernels/copies, {total/1e3:.3f} ms device time, "
          f"span {span/1e3:.3f} ms; events: backward alone {bwd_alone:.3f} ms "
          f"({flops / bwd_alone / 1e9:.1f} TF), step - forward {step_ms - fwd_ms:.3f} ms "
          f"({flops / (step_ms - fwd_ms) / 1e9:.1f} TF; step {step_ms:.3f}, forward {fwd_ms:.3f})")
    for e in events:
        print(f"  {e.device_time:9.1f} us  {e.name[:110]}")
    gaps = sorted(((b.time_range.start - a.time_range.end, b.name[:50]) for a, b in zip(events, events[1:])),
                  reverse=True)[:6]
    print("  largest gaps: " + "; ".join(f"{g:.0f} us before {nb}" for g, nb in gaps))
    del x, router, w1, w2, grad, out, params
    torch.cuda.empty_cache()
