"""Where the inference forward's wall time goes beyond its kernels, token rounding against top-K
(T 16384, d 1536, n 256, K 8; sweep 1 of DESIGN §6). bench.py's forward at E 64 reads ~40 µs
slower with rounding where the profiled kernels differ by ~15 µs (session 19, call 1). For each
routing: the CUDA-event median of eager calls queued back to back (bench.py's time_ms), the
same forward replayed from a CUDA graph (no host work), the host's time to issue one call (no
sync; the GPU is slower, so the queue never fills), and from one profiled call the kernels' sum
and their span (first start to last end: the sum plus the idle gaps between them). Then the
test for a host call that waits on the GPU: one call issued behind a ~30 ms GPU sleep, its host
time, whether the stream was still busy when it returned, and the CPU ops that took longest
(torch profiler, CPU activity): a call that blocks takes the sleep's time in one of them.

    python experiments/forward_host_gap.py [E ...]   # default: 64 512
"""
import statistics
import sys
import time

import torch
sys.path.insert(0, "python")  # run from the repository root
sys.path.insert(0, "benchmarks")
import sonicmoe
from torch.profiler import ProfilerActivity, profile
from sonicmoe.routing import token_rounding_expert_major
from bench import cuda_events, graph_time_ms, layer_params, time_ms, warm_up_gpu

T, d, n, K, TILE = 16384, 1536, 256, 8, 128


def host_us(fn, calls=20):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t) / calls * 1e6
    torch.cuda.synchronize()
    return host


warm_up_gpu()
for E in [int(a) for a in sys.argv[1:]] or [64, 512]:
    x, router, w1, w2 = layer_params(T, d, n, E)
    fns = {}
    for routing in ("topk_softmax", "token_rounding"):
        def forward(routing=routing):
            with torch.no_grad():
                return sonicmoe.moe(x, router, w1, w2, K, routing=routing, tile=TILE)
        fns[routing] = forward

    def routing_topk():  # the routing part alone: the router GEMM and R's top-K, or rounding's
        with torch.no_grad():
            return sonicmoe.router_topk(torch.nn.functional.linear(x, router), K, "topk_softmax")

    def routing_rounded():
        with torch.no_grad():
            return token_rounding_expert_major(torch.nn.functional.linear(x, router), K, TILE, fp32_probs=True)
    fns["routing topk"] = routing_topk
    fns["routing rounded"] = routing_rounded
    rows = {r: {"eager": [], "graph": [], "host": []} for r in fns}
    for _ in range(3):  # alternate, so drift hits both
        for routing, fn in fns.items():
            rows[routing]["eager"].append(time_ms(fn, warmup=3, iters=30) * 1e3)
            rows[routing]["host"].append(host_us(fn))
            try:
                rows[routing]["graph"].append(graph_time_ms(fn, iters=50) * 1e3)
            except Exception as err:  # noqa: BLE001 - report, keep measuring the rest
                print(f"E {E} {routing}: graph capture failed: {type(err).__name__}: {str(err)[:200]}")
    for routing, fn in fns.items():
        events = cuda_events(fn)
        kernel_sum = sum(e.device_time for e in events)
        span = events[-1].time_range.end - events[0].time_range.start
        med = {k: statistics.median(v) if v else float("nan") for k, v in rows[routing].items()}
        print(f"E {E:4d} {routing:15s} eager {med['eager']:7.1f} µs  graph {med['graph']:7.1f} µs  "
              f"host/call {med['host']:6.1f} µs  kernels {kernel_sum:7.1f} µs over a span of {span:7.1f} µs "
              f"({len(events)} events)")
    for routing, fn in fns.items():
        torch.cuda.synchronize()
        torch.cuda._sleep(60_000_000)  # ~30 ms of GPU time ahead of the call
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            t = time.perf_counter()
            fn()
            host = (time.perf_counter() - t) * 1e6
            busy = not torch.cuda.current_stream().query()
        torch.cuda.synchronize()
        top = sorted(prof.key_averages(), key=lambda a: a.self_cpu_time_total, reverse=True)[:6]
        ops = ", ".join(f"{a.key[:40]} {a.self_cpu_time_total:.0f}" for a in top)
        print(f"E {E:4d} {routing:15s} behind a GPU sleep: host {host:8.1f} µs, stream busy after: {busy}; "
              f"top self CPU µs: {ops}")
    del x, router, w1, w2
    torch.cuda.empty_cache()
