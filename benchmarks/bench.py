"""SonicMoE benchmark on the anchor configs (benchmarks/anchors/: upstream SonicMoE's published H200 figures).

Ops measured so far, each against its PyTorch counterpart in the same run:
- grouped_gemm: the down-projection of each config, M_total = T*K rows balanced over E
  experts, k = n, n_out = d, against torch._grouped_mm (TFLOP/s);
- combine: out[t] = sum_k s * Y[rev(t, k)] at (T, K, d), against the gather-multiply-sum of
  the torch reference (GB/s, against the device copy ceiling);
- moe_forward: the layer's forward (training mode, and no_grad) against a torch._grouped_mm layer;
- moe_backward: backward and forward+backward TFLOP/s and the memory kept after the forward;
  both with --activation (swiglu, geglu or reglu: the experts' gated activation, in both layers;
  upstream's anchors are SwiGLU's);
- activations: the layer's forward, backward and forward + backward with GeGLU and ReGLU over
  SwiGLU's, interleaved in one process on the same inputs;
- forward_kernels: K1 and K2 one by one on each varlen configuration (ping-pong 128x128,
  cooperative 128x256 and 256x128), and K2 on CUTLASS's ptr-array kernel, TFLOP/s of each;
- backward_kernels: the backward's kernels one by one (K4, K6, K5, K7) beside the interim weight
  gradients (gather + torch._grouped_mm), TFLOP/s of each;
- token_rounding: token rounding against top-K on the two sweeps of docs/design.md §6.
- moe_anchor_protocol: the layer's forward, backward and forward + backward timed the way the
  anchors' upstream figures were (upstream's own benchmark: a do_bench window after 0.5 s idle;
  ANCHOR_PROTOCOL), beside those figures and the torch._grouped_mm layer timed alike, and the
  card's dense bf16 matmul rate before and after, against the anchors' card's (its speed).
- sidebyside: upstream SonicMoE, sonicmoe.moe and a torch._grouped_mm layer in one process on one
  card (benchmarks/sidebyside.py; --configs also takes its MODELS or 'all'): the measure of every
  speed claim against upstream.
Prints tables; writes JSON and a PNG plot to --out. With --profile, forward_kernels and
backward_kernels run each part once after two warm-up calls, between cudaProfilerStart and
cudaProfilerStop, for a profiler started with collection off (scripts/ncu_parts.sh); their
tables then show that one call's time. With --energy they also read the card's mean power and SM
clock while each part runs back to back and its energy per call (NVML's energy counter), and
moe_backward reads the same for the layer's training step and its forward, and the backward's
energy per step: at the H200's power cap a training step is energy-bound (docs/performance.md), so a kernel change pays in the layer by the energy it saves per call more than by
its time alone, and the step's clock says whether a config runs at the cap.
With --settle MS every timed window follows MS ms of its own part's calls, untimed, so that a
reading is not its neighbour's power history (docs/performance.md).

  python benchmarks/bench.py --out bench-out [--configs paper-7b-n256,...] [--all-tiles]
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import statistics
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
import sonicmoe  # noqa: E402

ANCHORS = [ROOT / "benchmarks" / "anchors" / "h200-2026-11-29.json"]


def load_anchors():
    path = next(p for p in ANCHORS if p.exists())
    data = json.loads(path.read_text())
    configs = {}
    for row in data["rows"]:
        configs.setdefault(row["config"], {k: row[k] for k in ("T", "d", "n", "E", "K")})
    return path, data, configs


def time_ms(fn, warmup=10, iters=100):
    """Median CUDA-event time of fn in ms. All iterations are queued back to back (one sync at
    the end), so host launch cost is hidden behind GPU work as it is in a training step."""
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for start, end in zip(starts, ends):
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def graph_time_ms(fn, iters=30):
    """time_ms of fn captured once in a CUDA graph and replayed (no host work between kernels):
    warmed up on a side stream first, as capture requires."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return time_ms(graph.replay, warmup=5, iters=iters)


def cuda_events(fn):
    """The kernels and copies of one call of fn (torch profiler events on the GPU), in launch
    order: .name, .device_time (µs), .time_range (start, end in µs)."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                  key=lambda e: e.time_range.start)


def print_backward_kernels(label, step, forward, grad, clear_grads, min_us=5):
    """One backward's kernels after three warm steps: its span, then each kernel of at least min_us
    (start from the first, µs; streams overlap, so the sum can pass the span)."""
    for _ in range(3):
        step()
    out = forward()
    events = cuda_events(lambda: out.backward(grad))
    t0 = events[0].time_range.start
    span = max(e.time_range.end for e in events) - t0
    print(f"  {label}: backward span {span:.0f} µs (start, µs, kernel)", flush=True)
    for e in events:
        if e.device_time >= min_us:
            print(f"    {e.time_range.start - t0:8.0f} {e.device_time:8.0f}  {e.name[:90]}", flush=True)
    clear_grads()


def warm_up_gpu(seconds=1.0):
    """Bring the clocks up before the first measurement (the card idles at a low SM clock)."""
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    while True:
        for _ in range(10):
            x @ x
        end.record()
        end.synchronize()
        if start.elapsed_time(end) > seconds * 1e3:
            break


def rel_error(out, a, b, offs, experts_to_check=4):
    """Relative Frobenius error against fp32 on a few experts (full check lives in the tests)."""
    bounds = offs.tolist()
    num, den = 0.0, 0.0
    for e in torch.linspace(0, b.shape[0] - 1, experts_to_check).long().tolist():
        lo, hi = bounds[e], bounds[e + 1]
        ref = a[lo:hi].float() @ b[e].float().t()
        num += float((out[lo:hi].float() - ref).norm() ** 2)
        den += float(ref.norm() ** 2)
    return (num / den) ** 0.5


# --settle: ms of back-to-back calls of a fn, queued ahead of each of its timed windows.
SETTLE_MS = 0.0


def time_interleaved(fns, rounds=9, iters=40, settle_ms=None):
    """Median ms of each fn over rounds of back-to-back runs. The fns take turns and the order
    rotates every round, so clock and thermal drift and position in the round hit every
    implementation alike. With settle_ms (default SETTLE_MS, --settle) each window follows that
    much of the fn's own work, untimed: the card's power control remembers at least the last
    75 ms, so a short window after a hungrier neighbour reads up to 6% slow, one after an idle
    gap up to 15% fast (docs/performance.md)."""
    settle_ms = SETTLE_MS if settle_ms is None else settle_ms
    names = list(fns)
    samples = {name: [] for name in names}
    per_call = {name: time_ms(fn, warmup=5, iters=2) for name, fn in fns.items()}
    for r in range(rounds):
        for name in rotated(names, r):
            for _ in range(settle_calls(settle_ms, per_call[name])):
                fns[name]()
            samples[name].append(time_ms(fns[name], warmup=2, iters=iters))
    return {name: statistics.median(v) for name, v in samples.items()}


def rotated(names, r):
    """names in round r's order: each round starts one further on, so every name takes every place."""
    return names[r % len(names):] + names[:r % len(names)]


def settle_calls(settle_ms, ms_per_call):
    """Calls of about ms_per_call that fill settle_ms (none for 0; at most 10000)."""
    if settle_ms <= 0:
        return 0
    return min(10000, max(1, math.ceil(settle_ms / max(ms_per_call, 1e-3))))


def bench_down_projection(name, cfg, tiles):
    T, d, n, E, K = cfg["T"], cfg["d"], cfg["n"], cfg["E"], cfg["K"]
    m_total, k, n_out = T * K, n, d
    a = torch.randn(m_total, k, device="cuda").bfloat16()
    b = (torch.randn(E, n_out, k, device="cuda") * k**-0.5).bfloat16()
    offs = (torch.arange(E + 1, device="cuda") * (m_total // E)).to(torch.int32)
    offs[-1] = m_total
    flops = 2.0 * m_total * k * n_out
    row = {"config": name, "M_total": m_total, "k": k, "n_out": n_out, "E": E}

    b_t = b.transpose(1, 2)  # (E, k, n_out) view: torch._grouped_mm's layout, no copy
    fns = {"torch_grouped_mm": lambda: torch._grouped_mm(a, b_t, offs=offs[1:])}
    for tile in tiles:
        out = sonicmoe.grouped_gemm(a, b, offs, tile_config=tile)
        row[f"sonicmoe_{tile}_rel_err"] = rel_error(out, a, b, offs)
        fns[f"sonicmoe_{tile}"] = (lambda t: lambda: sonicmoe.grouped_gemm(a, b, offs, tile_config=t))(tile)
    for impl, ms in time_interleaved(fns).items():
        row[f"{impl}_tflops"] = flops / ms / 1e9
    row["ratio_auto_vs_torch"] = row["sonicmoe_auto_tflops"] / row["torch_grouped_mm_tflops"]
    return row


def bench_combine(name, cfg):
    T, d, E, K = cfg["T"], cfg["d"], cfg["E"], cfg["K"]
    experts = torch.rand(T, E, device="cuda").argsort(dim=-1)[:, :K]
    rev_idx = sonicmoe.routing_metadata(experts, E).rev_idx
    y = torch.randn(T * K, d, device="cuda").bfloat16()
    scores = torch.rand(T, K, device="cuda").softmax(-1)
    bytes_moved = T * K * d * 2 + T * d * 2 + T * K * 8
    idx = rev_idx.long()

    def torch_combine():
        return (scores[..., None] * y[idx].float()).sum(1).bfloat16()

    out = sonicmoe.combine(y, scores, rev_idx)
    ref = (scores.double()[..., None] * y.double()[idx]).sum(1)
    err = float((out.double() - ref).norm() / ref.norm())
    # K8: the backward's dx from K6's rows and the router's part d_logits @ router_weight: that
    # product (cuBLAS) as the start of combine_dx's sum (cuBLAS's addmm onto an unweighted
    # combine's output was the older form).
    d_logits = (0.01 * torch.randn(T, E, device="cuda")).bfloat16()
    router = (0.02 * torch.randn(E, d, device="cuda")).bfloat16()
    ones = torch.ones_like(scores)
    k8 = {"k8_router_as_addend": lambda: sonicmoe.combine_dx(y, rev_idx, d_logits @ router),
          "k8_router_by_addmm": lambda: sonicmoe.combine(y, ones, rev_idx).addmm_(d_logits, router),
          "k8_rows_only": lambda: sonicmoe.combine_dx(y, rev_idx)}
    k8_ref = y.double()[idx].sum(1) + d_logits.double() @ router.double()
    k8_err = float((k8["k8_router_as_addend"]().double() - k8_ref).norm() / k8_ref.norm())
    ms = time_interleaved({"sonicmoe": lambda: sonicmoe.combine(y, scores, rev_idx),
                           "torch": torch_combine, **k8})
    return {"config": name, "T": T, "K": K, "d": d, "E": E, "rel_err": err, "k8_rel_err": k8_err,
            "sonicmoe_GBps": bytes_moved / ms["sonicmoe"] / 1e6,
            "torch_GBps": bytes_moved / ms["torch"] / 1e6, "sonicmoe_ms": ms["sonicmoe"],
            **{f"{k}_us": ms[k] * 1e3 for k in k8}}


# --data: the values the layer benchmarks run on. The card runs a training step at its power cap,
# where the values' bits set the power and so the time; "anchor" draws them as upstream SonicMoE's
# own benchmark does for the anchors' figures (ANCHOR_PROTOCOL).
LAYER_DATA = "bench"
# --activation: the experts' gated activation in moe_forward / moe_backward (both layers).
ACTIVATION = "swiglu"


def layer_params(T, d, n, E, data=None):
    """x and the layer's parameters in the public layout (bf16 on the GPU, requiring grad): x (T, d),
    router (E, d), w1 (E, 2n, d), w2 (E, d, n). data "bench" (LAYER_DATA's default) scales them so
    that activations stay O(1); "anchor" as upstream's benchmarks/moe-cute.py: x = 0.2 N(0, 1), the
    experts N(0, 0.02), the router nn.Linear's default U(-d^-1/2, d^-1/2)."""
    data = data or LAYER_DATA
    if data not in ("bench", "anchor"):
        raise ValueError(f"data = {data!r} breaks the rule: must be 'bench' or 'anchor'")
    if data == "anchor":
        x = 0.2 * torch.randn(T, d, device="cuda")
        router = (2 * torch.rand(E, d, device="cuda") - 1) * d**-0.5
        w1 = 0.02 * torch.randn(E, 2 * n, d, device="cuda")
        w2 = 0.02 * torch.randn(E, d, n, device="cuda")
    else:
        x = torch.randn(T, d, device="cuda")
        router = torch.randn(E, d, device="cuda") * d**-0.5
        w1 = torch.randn(E, 2 * n, d, device="cuda") * d**-0.5
        w2 = torch.randn(E, d, n, device="cuda") * n**-0.5
    return tuple(t.bfloat16().requires_grad_() for t in (x, router, w1, w2))


def torch_grouped_mm_layer(x, router, w1, w2, top_k, activation="swiglu"):
    """The torchtitan-style baseline of the anchors: argsort gather, torch._grouped_mm up and
    down, silu * mul (act * mul for another gated activation), index_add combine."""
    T, d = x.shape
    E, _, n = w2.shape
    scores, experts = torch.nn.functional.linear(x, router).float().topk(top_k, dim=-1)
    scores = scores.softmax(-1)
    flat = experts.reshape(-1)
    order = flat.argsort(stable=True)
    offs = torch.zeros(E, dtype=torch.int32, device=x.device).scatter_add_(
        0, flat, torch.ones_like(flat, dtype=torch.int32)).cumsum(0, dtype=torch.int32)
    tokens = order // top_k
    h = torch._grouped_mm(x[tokens], w1.transpose(1, 2), offs=offs)
    a = sonicmoe.reference.glu_activation(h[:, :n], activation) * h[:, n:]
    y = torch._grouped_mm(a, w2.transpose(1, 2), offs=offs)
    y = y * scores.reshape(-1)[order, None].to(y.dtype)
    return torch.zeros_like(x).index_add_(0, tokens, y)


def bench_moe_forward(name, cfg, anchor_rows):
    """Forward as in training (weights and x require grad: autograd state is built), and the
    inference forward (no_grad) of sonicmoe beside it."""
    T, d, n, E, K = cfg["T"], cfg["d"], cfg["n"], cfg["E"], cfg["K"]
    x, router, w1, w2 = layer_params(T, d, n, E)
    flops = 6.0 * T * K * d * n

    act = ACTIVATION

    def inference():
        with torch.no_grad():
            return sonicmoe.moe(x, router, w1, w2, K, activation=act)

    ms = time_interleaved({"sonicmoe": lambda: sonicmoe.moe(x, router, w1, w2, K, activation=act),
                           "sonicmoe_no_grad": inference,
                           "torch_grouped_mm": lambda: torch_grouped_mm_layer(x, router, w1, w2, K, act)},
                          rounds=5, iters=10)
    up = upstream_anchor(anchor_rows, name)
    return {"config": name, "activation": act, "sonicmoe_fwd_tflops": flops / ms["sonicmoe"] / 1e9,
            "sonicmoe_no_grad_fwd_tflops": flops / ms["sonicmoe_no_grad"] / 1e9,
            "torch_grouped_mm_fwd_tflops": flops / ms["torch_grouped_mm"] / 1e9,
            "upstream_fwd_tflops_anchor": up.get("fwd_tflops"), "upstream_impl": up.get("impl")}


# Marks an anchor taken from upstream's torch.compile'd layer (where no eager figure exists).
COMPILED_MARK = "†"


def upstream_anchor(anchor_rows, name):
    """Upstream SonicMoE's anchor row at a config: the eager layer's, or where the anchors hold
    none (deepseek-v3), the torch.compile'd one's, marked by its impl."""
    for impl in ("sonicmoe-upstream", "sonicmoe-upstream-compiled"):
        row = next((r for r in anchor_rows if r["config"] == name and r["impl"] == impl and "fwd_tflops" in r), None)
        if row is not None:
            return row
    return {}


def kept_mib(fn):
    """Device memory still allocated after fn() returns its output, minus the output (MiB): what
    the forward keeps for backward (the anchors' kept_MiB)."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    kept = torch.cuda.memory_allocated() - base - out.numel() * out.element_size()
    del out
    return kept / 2**20


def step_peak_mib(step):
    """Peak device memory above what was allocated before one training step (forward and
    backward, the parameters' gradients included), MiB: the step's transient memory, such as
    the gathered copies of x and dO the eager weight gradients may take."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def bench_moe_backward(name, cfg, anchor_rows):
    """Training step pieces: forward, forward + backward (backward = their difference, same run),
    and the memory kept after the forward, for sonicmoe.moe and the torch._grouped_mm layer."""
    T, d, n, E, K = cfg["T"], cfg["d"], cfg["n"], cfg["E"], cfg["K"]
    x, router, w1, w2 = layer_params(T, d, n, E)
    grad = torch.randn(T, d, device="cuda").bfloat16()
    act = ACTIVATION
    layers = {"sonicmoe": lambda: sonicmoe.moe(x, router, w1, w2, K, activation=act),
              "torch_grouped_mm": lambda: torch_grouped_mm_layer(x, router, w1, w2, K, act)}
    params = (x, router, w1, w2)

    def step(layer):  # a training step's backward: gradients start unset (zero_grad's default)
        for t in params:
            t.grad = None
        layer().backward(grad)

    fns = {}
    for impl, layer in layers.items():
        fns[f"{impl}_fwd"] = layer
        fns[f"{impl}_fwd_bwd"] = (lambda layer: lambda: step(layer))(layer)
    ms = time_interleaved(fns, rounds=5, iters=5)
    fwd, fwd_bwd = 6.0 * T * K * d * n, 18.0 * T * K * d * n
    row = {"config": name, "activation": act}
    if MEASURE_ENERGY:  # ours only: the step's power and clock, the backward's energy per step
        power = energy_interleaved({k: fns[k] for k in ("sonicmoe_fwd", "sonicmoe_fwd_bwd")}, ms)
        for k, (watts, mhz, window_ms) in power.items():  # energy: the power window's own time a call
            row[f"{k}_W"], row[f"{k}_MHz"], row[f"{k}_J"] = watts, mhz, watts * window_ms / 1e3
        row["sonicmoe_bwd_J"] = row["sonicmoe_fwd_bwd_J"] - row["sonicmoe_fwd_J"]
        row["sonicmoe_bwd_pJ_per_flop"] = row["sonicmoe_bwd_J"] * 1e12 / (fwd_bwd - fwd)
    for impl, layer in layers.items():
        bwd_ms = ms[f"{impl}_fwd_bwd"] - ms[f"{impl}_fwd"]
        row[f"{impl}_bwd_tflops"] = (fwd_bwd - fwd) / bwd_ms / 1e9
        row[f"{impl}_fwd_bwd_tflops"] = fwd_bwd / ms[f"{impl}_fwd_bwd"] / 1e9
        row[f"{impl}_kept_MiB"] = kept_mib(layer)
        for t in params:
            t.grad = None
        row[f"{impl}_step_peak_MiB"] = step_peak_mib(fns[f"{impl}_fwd_bwd"])
        for t in params:
            t.grad = None
    up = upstream_anchor(anchor_rows, name)
    row.update({f"upstream_{k}_anchor": up.get(k) for k in ("bwd_tflops", "fwd_bwd_tflops", "kept_MiB")})
    row["upstream_impl"] = up.get("impl")
    return row


def bench_activations(name, cfg):
    """sonicmoe.moe's training forward and forward + backward with each gated activation, on the
    same inputs, interleaved in one process: GeGLU's and ReGLU's TFLOP/s beside SwiGLU's."""
    T, d, n, E, K = cfg["T"], cfg["d"], cfg["n"], cfg["E"], cfg["K"]
    x, router, w1, w2 = layer_params(T, d, n, E)
    grad = torch.randn(T, d, device="cuda").bfloat16()
    params = (x, router, w1, w2)

    def step(act):
        for t in params:
            t.grad = None
        sonicmoe.moe(x, router, w1, w2, K, activation=act).backward(grad)

    fns = {}
    for act in sonicmoe.GLU_ACTIVATIONS:
        fns[f"{act}_fwd"] = (lambda act: lambda: sonicmoe.moe(x, router, w1, w2, K, activation=act))(act)
        fns[f"{act}_fwd_bwd"] = (lambda act: lambda: step(act))(act)
    ms = time_interleaved(fns, rounds=5, iters=5)
    fwd, fwd_bwd = 6.0 * T * K * d * n, 18.0 * T * K * d * n
    row = {"config": name}
    for act in sonicmoe.GLU_ACTIVATIONS:
        row[f"{act}_fwd_tflops"] = fwd / ms[f"{act}_fwd"] / 1e9
        row[f"{act}_bwd_tflops"] = (fwd_bwd - fwd) / (ms[f"{act}_fwd_bwd"] - ms[f"{act}_fwd"]) / 1e9
        row[f"{act}_fwd_bwd_tflops"] = fwd_bwd / ms[f"{act}_fwd_bwd"] / 1e9
    return row


# How the anchors' upstream figures were taken: upstream SonicMoE's own benchmark
# (benchmarks/moe-cute.py of Dao-AILab/sonic-moe) times the training forward and the forward +
# backward each as one triton.testing.do_bench window (warmup 5 ms, rep 500 ms: the mean of the
# calls, a 256 MB L2 flush queued before each) after 0.5 s of idle, and derives the backward as
# their difference; the anchors' rows satisfy bwd = 12 / (18 / fwd_bwd - 6 / fwd) to their digits.
# The card's power control runs a kernel 12-15% fast for ~12 calls after an idle gap and holds
# its power history for 75 ms and more (docs/performance.md), so figures taken this way
# and figures taken in a sustained back-to-back rotation (moe_backward) are not comparable.
ANCHOR_PROTOCOL = {"idle_s": 0.5, "warmup_ms": 5.0, "rep_ms": 500.0}


def flushed_mean_ms(fn, warmup_ms, rep_ms, flush=None):
    """triton.testing.do_bench's measurement (triton 3.x, return_mode "mean"), for machines without
    triton: 5 calls estimate a call's time, then warmup_ms of untimed calls, then rep_ms of calls,
    each timed by CUDA events with flush() ahead of it (out of the timed range; by default a 256 MB
    buffer zeroed, which pushes fn's data out of L2)."""
    fn()
    torch.cuda.synchronize()
    if flush is None:
        flush = torch.empty(int(256e6 // 4), dtype=torch.int32, device="cuda").zero_
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        flush()
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate_ms = max(start.elapsed_time(end) / 5, 1e-6)
    n_warmup, n_repeat = max(1, int(warmup_ms / estimate_ms)), max(1, int(rep_ms / estimate_ms))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_repeat)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_repeat)]
    for _ in range(n_warmup):
        fn()
    for s, e in zip(starts, ends):
        flush()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.mean(s.elapsed_time(e) for s, e in zip(starts, ends))


def anchor_protocol_timer():
    """(name, timer(fn, warmup_ms, rep_ms) -> mean ms): triton's do_bench where triton imports, as
    upstream's benchmark calls it, else flushed_mean_ms."""
    try:
        from triton.testing import do_bench
    except ImportError:
        return "flushed_mean_ms", flushed_mean_ms
    return "triton.testing.do_bench", lambda fn, warmup_ms, rep_ms: do_bench(fn, warmup=warmup_ms, rep=rep_ms)


def card_matmul_tflops(timer, windows=3, n=8192, device="cuda"):
    """The card's dense bf16 n x n x n matmul TFLOP/s, the median of `windows` timer windows (200 ms
    warm-up, 1 s each): the anchors' first ceiling (752 on their card; they do not say how it was
    timed). Read beside the anchors' protocol, it tells how fast this card is: two
    boots of an H200 move the layer's figures by 1-4% (docs/performance.md)."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn_like(a)
    ms = statistics.median(timer(lambda: a @ b, 200.0, 1000.0) for _ in range(windows))
    return 2.0 * n ** 3 / ms / 1e9


def card_speed_line(card, anchor_tflops):
    """The card's matmul rate before and after the protocol, against the anchors' card."""
    line = (f"this card: dense bf16 8192^3 matmul {card['before']:.1f} / {card['after']:.1f} TFLOP/s before / "
            f"after the configs")
    if anchor_tflops:
        line += (f"; the anchors' card: {anchor_tflops:g}, this one at {card['before'] / anchor_tflops:.3f} / "
                 f"{card['after'] / anchor_tflops:.3f} of it")
    return line


def anchor_protocol_ms(fn, timer, idle_s=None):
    """One figure the anchors' way: the card idles idle_s, then one timer window of fn."""
    torch.cuda.synchronize()
    time.sleep(ANCHOR_PROTOCOL["idle_s"] if idle_s is None else idle_s)
    return timer(fn, ANCHOR_PROTOCOL["warmup_ms"], ANCHOR_PROTOCOL["rep_ms"])


def backward_variants_in_turn(name, variants, apply, forward, step, bwd_flops, rounds, timer, base):
    """The layer's backward TFLOP/s under each variant, timed the anchors' way (fwd+bwd less fwd),
    the variants alternating in this process and rotating by round; apply(variant) switches to one.
    Prints each reading and the medians against base's; returns {variant: [TFLOP/s per round]}."""
    bwd = {v: [] for v in variants}
    for r in range(rounds):
        for v in rotated(list(variants), r):
            apply(v)
            fwd_ms = anchor_protocol_ms(forward, timer)
            fwd_bwd_ms = anchor_protocol_ms(step, timer)
            bwd[v].append(bwd_flops / (fwd_bwd_ms - fwd_ms) / 1e9)
            print(f"  {name} round {r} {v}: fwd {fwd_ms:.3f} ms, fwd+bwd {fwd_bwd_ms:.3f} ms, "
                  f"bwd {bwd[v][-1]:.1f} TF", flush=True)
    ref = statistics.median(bwd[base])
    print(f"{name}: bwd TFLOP/s (median of {rounds}) " +
          " | ".join(f"{v} {statistics.median(t):.1f} ({statistics.median(t) / ref:.3f})" for v, t in bwd.items()),
          flush=True)
    return bwd


def anchor_protocol_interleaved(fns, rounds):
    """Median ms of each fn over rounds of anchor_protocol_ms windows, the order rotating by round."""
    _, timer = anchor_protocol_timer()
    names = list(fns)
    samples = {name: [] for name in names}
    for r in range(rounds):
        for name in rotated(names, r):
            samples[name].append(anchor_protocol_ms(fns[name], timer))
    return {name: statistics.median(v) for name, v in samples.items()}


def bench_moe_anchor_protocol(name, cfg, anchor_rows, rounds=3, data="anchor"):
    """The layer's training forward, forward + backward and backward (their difference) timed as the
    anchors' upstream figures were (ANCHOR_PROTOCOL, on `data`'s values, the output gradient N(0, 1)
    as there), for sonicmoe.moe and the torch._grouped_mm layer, `rounds` times in alternating
    order. TFLOP/s per round and their medians beside the anchors' upstream figures."""
    T, d, n, E, K = cfg["T"], cfg["d"], cfg["n"], cfg["E"], cfg["K"]
    x, router, w1, w2 = layer_params(T, d, n, E, data=data)
    grad = torch.randn(T, d, device="cuda").bfloat16()
    params = (x, router, w1, w2)
    layers = {"sonicmoe": lambda: sonicmoe.moe(x, router, w1, w2, K),
              "torch_grouped_mm": lambda: torch_grouped_mm_layer(x, router, w1, w2, K)}

    def step(layer):
        layer().backward(grad)
        for t in params:
            t.grad = None

    timer_name, timer = anchor_protocol_timer()
    fwd_flops, fwd_bwd_flops = 6.0 * T * K * d * n, 18.0 * T * K * d * n
    row = {"config": name, "data": data, "timer": timer_name, **ANCHOR_PROTOCOL}
    for r in range(rounds):
        for impl in (list(layers) if r % 2 == 0 else list(layers)[::-1]):
            fwd_ms = anchor_protocol_ms(layers[impl], timer)
            fwd_bwd_ms = anchor_protocol_ms(lambda: step(layers[impl]), timer)
            for key, value in (("fwd", fwd_flops / fwd_ms), ("fwd_bwd", fwd_bwd_flops / fwd_bwd_ms),
                               ("bwd", (fwd_bwd_flops - fwd_flops) / (fwd_bwd_ms - fwd_ms))):
                row.setdefault(f"{impl}_{key}_tflops_rounds", []).append(value / 1e9)
            print(f"  {name} round {r} {impl}: fwd {fwd_ms:.3f} ms, fwd+bwd {fwd_bwd_ms:.3f} ms", flush=True)
    for key in [k for k in row if k.endswith("_rounds")]:
        row[key.removesuffix("_rounds")] = statistics.median(row[key])
    up = upstream_anchor(anchor_rows, name)
    row.update({f"upstream_{k}_tflops_anchor": up.get(f"{k}_tflops") for k in ("fwd", "bwd", "fwd_bwd")})
    row["upstream_impl"] = up.get("impl")
    return row


# Issue "token rounding": sweeps of (T, d, n, K) with E varied.
def expert_inputs(cfg):
    """x, w1, w2 and the sorted-layout metadata (offsets, gather_idx) of balanced random top-K
    routing at a config: the per-kernel benchmarks' inputs."""
    from sonicmoe._ops import device_routing_metadata

    T, d, n, E, K = cfg["T"], cfg["d"], cfg["n"], cfg["E"], cfg["K"]
    x = torch.randn(T, d, device="cuda").bfloat16()
    w1 = (torch.randn(E, 2 * n, d, device="cuda") * d**-0.5).bfloat16()
    w2 = (torch.randn(E, d, n, device="cuda") * n**-0.5).bfloat16()
    _, experts = sonicmoe.router_topk(torch.randn(T, E, device="cuda"), K, "topk_softmax")
    meta = device_routing_metadata(experts, E)
    return x, w1, w2, meta.expert_offsets, meta.gather_idx


def backward_inputs(cfg):
    """expert_inputs plus what the backward's kernels read: H (up_proj's), a random dO and row
    scores, and K4's dH and A' from them; a dict by the kernels' argument names."""
    from sonicmoe._ops import down_proj_grad

    T, d, K = cfg["T"], cfg["d"], cfg["K"]
    x, w1, w2, off, g = expert_inputs(cfg)
    h, _ = sonicmoe.up_proj(x, w1, off, g)
    d_out = torch.randn(T, d, device="cuda").bfloat16()
    row_score = torch.rand(T * K, device="cuda")
    d_h, a_scaled, _ = down_proj_grad(d_out, w2, h, row_score, off, g)
    return dict(x=x, w1=w1, w2=w2, off=off, g=g, h=h, d_out=d_out, row_score=row_score, d_h=d_h,
                a_scaled=a_scaled)


def bench_backward_kernels(name, cfg, parts=None):
    """The backward's GEMMs one by one at a config (balanced random routing), with the interim
    weight-gradient path (gathered copy + torch._grouped_mm) beside K5/K7 in the same run; parts:
    the names to time (default all)."""
    from sonicmoe._ops import down_proj_grad, grouped_gemm_kn, weight_grad

    T, d, n, K = cfg["T"], cfg["d"], cfg["n"], cfg["K"]
    i = backward_inputs(cfg)
    x, w1, w2, off, g, h = i["x"], i["w1"], i["w2"], i["off"], i["g"], i["h"]
    d_out, row_score, d_h, a_scaled = i["d_out"], i["row_score"], i["d_h"], i["a_scaled"]
    gemm = 2.0 * T * K * d * n  # one d x n GEMM over the T*K rows
    fns = {
        "K4_down_proj_grad": (lambda: down_proj_grad(d_out, w2, h, row_score, off, g), gemm),
        "K6_grouped_gemm_kn": (lambda: grouped_gemm_kn(d_h, w1, off), 2 * gemm),
        **{f"K4_{short}": ((lambda t: lambda: down_proj_grad(d_out, w2, h, row_score, off, g, tile_config=t))(tile), gemm)
           for tile, short in VARLEN_TILES.items()},
        **{f"K6_{short}": ((lambda t: lambda: grouped_gemm_kn(d_h, w1, off, tile_config=t))(tile), 2 * gemm)
           for tile, short in VARLEN_TILES.items()},
        "K6_pp_n192": (lambda: grouped_gemm_kn(d_h, w1, off, tile_config=VARLEN_PP_N192), 2 * gemm),
        "K5_weight_grad_dw2": (lambda: weight_grad(d_out, a_scaled, off, g, True, tile_config=VARLEN_PP), gemm),
        "K7_weight_grad_dw1": (lambda: weight_grad(d_h, x, off, g, False, tile_config=VARLEN_PP), 2 * gemm),
        "K5_co_n256": (lambda: weight_grad(d_out, a_scaled, off, g, True), gemm),   # auto
        "K7_co_m256": (lambda: weight_grad(d_h, x, off, g, False), 2 * gemm),       # auto
        "K5_co_c2x1": (lambda: weight_grad(d_out, a_scaled, off, g, True, tile_config=VARLEN_CO_C2X1), gemm),
        "K7_co_c2x1": (lambda: weight_grad(d_h, x, off, g, False, tile_config=VARLEN_CO_C2X1), 2 * gemm),
        "gather_gmm_dw2": (lambda: torch._grouped_mm(d_out[g.long()].t(), a_scaled, offs=off[1:]), gemm),
        "gather_gmm_dw1": (lambda: torch._grouped_mm(d_h.t(), x[g.long()], offs=off[1:]), 2 * gemm),
    }
    return time_kernels(name, fns, parts)


# --profile: the per-kernel tables run each part once inside the profiler's range instead of timing it.
PROFILE_ONE_CALL = False


def profile_one_call(fns):
    """Each callable twice as warm-up, then once between cudaProfilerStart and cudaProfilerStop;
    returns that call's ms (CUDA events; under a profiler's replay only a rough figure)."""
    ms = {}
    for k, fn in fns.items():
        fn()
        fn()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        ms[k] = start.elapsed_time(stop)
    return ms


# --energy: the per-kernel tables and moe_backward also read power, SM clock and energy per call.
MEASURE_ENERGY = False


def _nvml_readers():
    """Readers of the card's energy counter (mJ) and SM clock (MHz), NVML through torch.cuda."""
    try:
        import pynvml
        handle = torch.cuda._get_pynvml_handler()
    except Exception as exc:  # noqa: BLE001: any failure means no counter
        sys.exit(f"bench.py --energy needs NVML (pynvml) for the card's energy counter: {exc}")
    return (lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle),
            lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))


def mean_power_w(fn, ms_per_call, read, clock=None, seconds=0.6, settle=0.2, give_up=10.0):
    """The card's mean power (W) while fn runs back to back, the median SM clock (MHz) read at
    each energy-counter step inside the window (NaN without a clock reader), and the window's time
    a call (ms; the calls done inside it counted to a chunk, with the same lag at both ends).
    Calls are queued in chunks of about 2 ms of GPU work, the host staying two chunks ahead (so the
    GPU never idles and the queue drains at once at the end), and the energy counter is read after
    each chunk: it moves in steps, tens of ms apart on some cards. The window runs from the first
    step seen `settle` s in to the first one `seconds` later, so neither the ramp-up nor the tail is
    in it. NaN if the counter does not move."""
    chunk = max(1, int(2.0 / ms_per_call))
    torch.cuda.synchronize()
    t_start = time.perf_counter()
    last, window, queued, mhz, issued = read(), None, [], [], 0
    while True:
        for _ in range(chunk):
            fn()
        issued += chunk
        queued.append(torch.cuda.Event())
        queued[-1].record()
        if len(queued) > 2:
            queued.pop(0).synchronize()
        now, value = time.perf_counter(), read()
        if now - t_start > give_up:
            torch.cuda.synchronize()
            return float("nan"), float("nan"), float("nan")
        if value == last:
            continue
        last = value
        done = issued - chunk * len(queued)
        if window is None:
            if now - t_start >= settle:
                window = (value, now, done)
        elif now - window[1] >= seconds:
            break
        elif clock is not None:
            mhz.append(clock())  # the GPU is still busy: two chunks are queued behind this one
    torch.cuda.synchronize()
    seconds_in = now - window[1]
    return ((value - window[0]) / 1e3 / seconds_in, (statistics.median(mhz) if mhz else float("nan")),
            seconds_in * 1e3 / max(done - window[2], 1))


def energy_interleaved(fns, ms, rounds=3):
    """Median mean power (W), SM clock (MHz) and time per call in the window (ms) of each fn over
    rounds that take turns as time_interleaved's do; ms: each fn's time per call (to size the windows)."""
    read, clock = _nvml_readers()
    names = list(fns)
    samples = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            samples[name].append(mean_power_w(fns[name], ms[name], read, clock))
    return {name: tuple(statistics.median(x) for x in zip(*v)) for name, v in samples.items()}


def time_kernels(name, fns, parts=None):
    """One row of per-kernel times: fns maps a name to (callable, FLOPs per call); only the names
    in parts when given. With --energy also each part's power (W), SM clock (MHz), time a call in
    the power's window (us) and energy per call (mJ: the power times that time, both from one
    window, as sidebyside.py's ENERGY reads a layer)."""
    if parts:
        fns = {k: v for k, v in fns.items() if k in parts}
    callables = {k: fn for k, (fn, _) in fns.items()}
    ms = profile_one_call(callables) if PROFILE_ONE_CALL else time_interleaved(callables, rounds=3, iters=10)
    power = energy_interleaved(callables, ms) if MEASURE_ENERGY and not PROFILE_ONE_CALL else {}
    row = {"config": name}
    for k, (_, flops) in fns.items():
        row[f"{k}_us"] = ms[k] * 1e3
        row[f"{k}_tflops"] = flops / ms[k] / 1e9
        if k in power:
            watts, row[f"{k}_MHz"], window_ms = power[k]
            row[f"{k}_W"], row[f"{k}_window_us"] = watts, window_ms * 1e3
            row[f"{k}_mJ"] = watts * window_ms
            row[f"{k}_pJ_per_flop"] = watts * window_ms * 1e9 / flops
    return row


def bench_forward_kernels(name, cfg, parts=None):
    """K1 and K2 one by one at a config (balanced random routing) on each varlen configuration,
    K2 on CUTLASS's ptr-array kernel (auto), and K1 (auto) without storing H (the inference
    forward's K1: the difference to K1_co_n256 is what keeping H costs), in the same run."""
    T, d, n, K = cfg["T"], cfg["d"], cfg["n"], cfg["K"]
    x, w1, w2, off, g = expert_inputs(cfg)
    _, a = sonicmoe.up_proj(x, w1, off, g)
    gemm = 2.0 * T * K * d * n  # one d x n GEMM over the T*K rows
    k2 = lambda tile: lambda: sonicmoe.grouped_gemm(a, w2, off, tile_config=tile)  # noqa: E731
    k1 = lambda tile: lambda: sonicmoe.up_proj(x, w1, off, g, tile_config=tile)  # noqa: E731
    fns = {"K2_auto": (k2("auto"), gemm),
           "K1_no_h": (lambda: sonicmoe.up_proj(x, w1, off, g, keep_h=False), 2 * gemm)}
    for tile, short in VARLEN_TILES.items():
        fns[f"K1_{short}"] = (k1(tile), 2 * gemm)
        fns[f"K2_{short}"] = (k2(tile), gemm)
    fns["K2_pp_n192"] = (k2(VARLEN_PP_N192), gemm)  # grouped_gemm's own tile
    return time_kernels(name, fns, parts)


# The varlen kernel's configurations, by their short names in the forward_kernels table.
VARLEN_PP = "varlen_pingpong_128x128x64"
VARLEN_CO_C2X1 = "varlen_cooperative_128x256x64_c2x1"
VARLEN_TILES = {VARLEN_PP: "pp", "varlen_cooperative_128x256x64": "co_n256",
                "varlen_cooperative_256x128x64": "co_m256", VARLEN_CO_C2X1: "co_n256_c2x1",
                "varlen_pingpong_128x128x64_c2x1": "pp_c2x1"}
# grouped_gemm's own tile (K2 and K6 only): the _pp_n192 columns.
VARLEN_PP_N192 = "varlen_pingpong_128x192x64"


TOKEN_ROUNDING_SWEEPS = {
    "T16384-d1536-n256-K8": [dict(T=16384, d=1536, n=256, K=8, E=E) for E in (64, 128, 256, 512)],
    "T16384-d4096-n1024-K4": [dict(T=16384, d=4096, n=1024, K=4, E=E) for E in (32, 64, 128, 256)],
}


def bench_token_rounding(cfg, tile=128):
    """Forward, backward and fwd+bwd of token rounding against topk_softmax at one sweep point, and
    top-K's padding waste: rows added by rounding every expert's count up to the tile, over T*K.
    The forward is also split into its routing part (router GEMM, top-K or rounding) and its
    expert part (sorted layout, K1, K2, K3 from given routing decisions)."""
    from sonicmoe._ops import device_routing_metadata, grouped_gemm, up_proj
    from sonicmoe.functional import _MoEDenseExperts
    from sonicmoe.routing import dense_routing_metadata_expert_major, dense_row_bound, token_rounding_expert_major

    T, d, n, E, K = cfg["T"], cfg["d"], cfg["n"], cfg["E"], cfg["K"]
    x, router, w1, w2 = layer_params(T, d, n, E)
    grad = torch.randn(T, d, device="cuda").bfloat16()
    with torch.no_grad():
        logits = torch.nn.functional.linear(x, router)
        scores, experts = sonicmoe.router_topk(logits, K, "topk_softmax")
        counts = torch.bincount(experts.flatten(), minlength=E)
        padded = ((counts + tile - 1) // tile * tile).sum()
        waste = float((padded - counts.sum()) / counts.sum())
        probs, probs_t, assigned_t = token_rounding_expert_major(logits.float(), K, tile)
    fns = {}
    for routing in ("topk_softmax", "token_rounding"):
        def fwd(routing=routing):
            with torch.no_grad():
                return sonicmoe.moe(x, router, w1, w2, K, routing=routing, tile=tile)
        fns[f"{routing}_fwd"] = fwd
        fns[f"{routing}_fwd_bwd"] = (lambda routing: lambda: sonicmoe.moe(
            x, router, w1, w2, K, routing=routing, tile=tile).backward(grad))(routing)

    def experts_topk():
        with torch.no_grad():
            return sonicmoe.moe_routed(x, w1, w2, scores, experts)

    def experts_rounded():
        with torch.no_grad():
            return _MoEDenseExperts.apply(x, w1, w2, probs, probs_t, assigned_t, K, tile, False, "swiglu")

    fns["topk_softmax_experts"] = experts_topk
    fns["token_rounding_experts"] = experts_rounded
    # The expert GEMMs alone (K1 + K2 over metadata built once): the kernel time the SonicMoE
    # paper states its rounding speedup for. Same kernels and tiles as the layer's forward.
    topk_meta = device_routing_metadata(experts, E)
    dense_meta = dense_routing_metadata_expert_major(probs_t, assigned_t, dense_row_bound(T, E, K, tile))

    def gemms_topk():
        _, a = up_proj(x, w1, topk_meta.expert_offsets, topk_meta.gather_idx, keep_h=False)
        return grouped_gemm(a, w2, topk_meta.expert_offsets)

    def gemms_rounded():
        _, a = up_proj(x, w1, dense_meta.expert_offsets, dense_meta.gather_idx, keep_h=False, partial_rows=True)
        return grouped_gemm(a, w2, dense_meta.expert_offsets, tile_config="varlen_pingpong_128x128x64",
                            partial_rows=True)

    fns["topk_softmax_gemms"] = gemms_topk
    fns["token_rounding_gemms"] = gemms_rounded
    # Each part's two routings interleave only with each other. In one rotation of all eight the
    # rounded forward always ran right after top-K's fwd+bwd, the heaviest, and top-K's forward
    # never did: on a card whose clock falls under load at its power cap, any after-effect of
    # that load fell on one side only.
    ms = {}
    for part in ("fwd", "fwd_bwd", "experts", "gemms"):
        ms.update(time_interleaved({f"{r}_{part}": fns[f"{r}_{part}"] for r in ("topk_softmax", "token_rounding")},
                                   rounds=6, iters=10))
    row = dict(cfg, topk_padding_waste=waste)
    for routing in ("topk_softmax", "token_rounding"):
        for part in ("fwd", "fwd_bwd", "experts", "gemms"):
            row[f"{routing}_{part}_ms"] = ms[f"{routing}_{part}"]
        row[f"{routing}_bwd_ms"] = ms[f"{routing}_fwd_bwd"] - ms[f"{routing}_fwd"]
    row["fwd_speedup"] = row["topk_softmax_fwd_ms"] / row["token_rounding_fwd_ms"]
    row["experts_speedup"] = row["topk_softmax_experts_ms"] / row["token_rounding_experts_ms"]
    row["gemms_speedup"] = row["topk_softmax_gemms_ms"] / row["token_rounding_gemms_ms"]
    return row


def per_config(names, bench, path, **extra):
    """bench(name) for each config (freeing the allocator's cache between them), saved as JSON
    {"rows": [...], **extra} at path; returns the rows."""
    rows = []
    for name in names:
        rows.append(bench(name))
        torch.cuda.empty_cache()
    path.write_text(json.dumps({**extra, "rows": rows}, indent=1))
    return rows


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["config"] for r in rows]
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(11, 4.5))
    w = 0.38
    ax.bar([i - w / 2 for i in x], [r["sonicmoe_auto_tflops"] for r in rows], w, label="sonicmoe grouped_gemm")
    ax.bar([i + w / 2 for i in x], [r["torch_grouped_mm_tflops"] for r in rows], w, label="torch._grouped_mm")
    ax.set_xticks(list(x), names, rotation=20, ha="right")
    ax.set_ylabel("TFLOP/s (bf16)")
    ax.set_title("Down-projection grouped GEMM, H200 (M_total = T*K balanced over E)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


# The per-kernel tables: op -> (bench function, its columns, the table's note).
KERNEL_TABLES = {
    "forward_kernels": (bench_forward_kernels,
                        tuple(f"K{i}_{short}" for i in (1, 2) for short in VARLEN_TILES.values())
                        + ("K2_pp_n192", "K2_auto", "K1_no_h"),
                        "pp = ping-pong 128x128 (pp_n192: 128x192, K2 and K6 only), co_n256 / co_m256 = cooperative 128x256 / "
                        "256x128 (_c2x1: in 2 x 1 clusters); "
                        "K2_auto = CUTLASS ptr-array; K1_no_h = K1 (auto) storing only A"),
    "backward_kernels": (bench_backward_kernels,
                         ("K4_down_proj_grad", "K4_pp", "K4_co_n256", "K4_co_m256", "K4_co_n256_c2x1", "K4_pp_c2x1",
                          "K6_grouped_gemm_kn", "K6_pp", "K6_co_n256", "K6_co_m256", "K6_co_n256_c2x1", "K6_pp_c2x1",
                          "K6_pp_n192",
                          "K5_weight_grad_dw2", "K5_co_n256", "K7_weight_grad_dw1", "K7_co_m256",
                          "K5_co_c2x1", "K7_co_c2x1", "gather_gmm_dw2", "gather_gmm_dw1"),
                         "K4, K6 = auto; _pp = ping-pong 128x128 (_pp_n192: 128x192), _co_n256 / _co_m256 = cooperative "
                         "128x256 / 256x128 (_c2x1: in 2 x 1 clusters); "
                         "K5/K7 = weight_grad ping-pong, _co = cooperative (auto), _co_c2x1 = cooperative in 2 x 1 clusters, gather_gmm = gathered copy + torch._grouped_mm"),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="bench-out", help="folder for JSON and PNG")
    parser.add_argument("--configs", default="", help="comma-separated config names (default all)")
    parser.add_argument("--all-tiles", action="store_true", help="also time every tile config")
    parser.add_argument("--ops", default="grouped_gemm,combine", help="comma-separated ops to time")
    parser.add_argument("--parts", default="", help="forward_kernels / backward_kernels: comma-separated "
                        "columns to time (e.g. K4_down_proj_grad,K6_grouped_gemm_kn; default all)")
    parser.add_argument("--profile", action="store_true", help="forward_kernels / backward_kernels: run each "
                        "part once inside cudaProfilerStart / Stop instead of timing it (scripts/ncu_parts.sh)")
    parser.add_argument("--energy", action="store_true", help="forward_kernels / backward_kernels / moe_backward: "
                        "also the card's mean power and SM clock while each part (the layer's step) runs back to "
                        "back, and its energy per call (NVML)")
    parser.add_argument("--settle", type=float, default=0.0, metavar="MS", help="queue MS ms of each part's "
                        "(layer's) own calls ahead of each of its timed windows, so that a reading is its own "
                        "steady state and not its neighbour's power history (e.g. 250; default 0)")
    parser.add_argument("--data", choices=("bench", "anchor"), default=None, help="the layer's values "
                        "(layer_params): moe_forward / moe_backward default to bench, moe_anchor_protocol to anchor")
    parser.add_argument("--rounds", type=int, default=3, help="moe_anchor_protocol: rounds per config")
    parser.add_argument("--activation", choices=list(sonicmoe.GLU_ACTIVATIONS), default="swiglu",
                        help="moe_forward / moe_backward: the experts' gated activation, in both layers (upstream's "
                        "anchors stay SwiGLU's; sidebyside takes env ACTIVATION)")
    args = parser.parse_args()
    global PROFILE_ONE_CALL, MEASURE_ENERGY, SETTLE_MS, LAYER_DATA, ACTIVATION
    PROFILE_ONE_CALL = args.profile
    MEASURE_ENERGY = args.energy
    if args.settle < 0:
        parser.error(f"--settle: {args.settle} ms must be >= 0")
    SETTLE_MS = args.settle
    LAYER_DATA = args.data or "bench"
    ACTIVATION = args.activation
    if args.rounds < 1:
        parser.error(f"--rounds: {args.rounds} must be >= 1")
    parts = {p for p in args.parts.split(",") if p}
    known = {p for _, columns, _ in KERNEL_TABLES.values() for p in columns}
    if parts - known:
        parser.error(f"--parts: unknown {sorted(parts - known)}; the tables' columns are {sorted(known)}")

    if not (torch.cuda.is_available() and sonicmoe.extension_available()):
        sys.exit("bench.py needs a Hopper or Blackwell (B200) GPU and the built extension (python setup.py "
                 "build_ext --inplace)")
    anchors_path, anchors, configs = load_anchors()
    names = [c for c in args.configs.split(",") if c] or list(configs)
    tiles = list(sonicmoe.GEMM_TILE_CONFIGS) if args.all_tiles else ["auto"]

    ops = args.ops.split(",")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if "sidebyside" in ops:  # its own configs and timer (one process, interleaved rounds)
        import sidebyside
        sidebyside.run([c for c in args.configs.split(",") if c], rounds=args.rounds, out_dir=out)
        ops.remove("sidebyside")
        if not ops:
            return
    warm_up_gpu()
    if "combine" in ops:
        ceiling = anchors.get("ceilings", {}).get("device_copy_GBps")
        combine_rows = per_config(names, lambda name: bench_combine(name, configs[name]), out / "combine.json",
                                  ceiling_copy_GBps=ceiling)
        print(f"{'config':<18}{'T':>7}{'K':>4}{'d':>6}{'ms':>8}{'GB/s':>8}{'of copy':>9}{'torch GB/s':>12}{'err':>9}")
        for r in combine_rows:
            frac = r["sonicmoe_GBps"] / ceiling if ceiling else float("nan")
            print(f"{r['config']:<18}{r['T']:>7}{r['K']:>4}{r['d']:>6}{r['sonicmoe_ms']:>8.3f}"
                  f"{r['sonicmoe_GBps']:>8.0f}{frac:>9.2f}{r['torch_GBps']:>12.0f}{r['rel_err']:>9.1e}")
        print(f"(combine: bytes = T*K*d*2 read + T*d*2 written + indices; copy ceiling {ceiling} GB/s)\n")
        print(f"{'config':<18}{'E':>5}{'K8 router as addend':>21}{'by addmm':>10}{'rows only':>11}{'err':>9}")
        for r in combine_rows:
            print(f"{r['config']:<18}{r['E']:>5}{r['k8_router_as_addend_us']:>21.1f}"
                  f"{r['k8_router_by_addmm_us']:>10.1f}{r['k8_rows_only_us']:>11.1f}{r['k8_rel_err']:>9.1e}")
        print("(K8, us: dx = the K rows' sum + d_logits @ router_weight: that product by cuBLAS as combine_dx's "
              "addend, or cuBLAS's addmm onto an unweighted combine; rows only: combine_dx without it)\n")
    if "moe_forward" in ops:
        fwd_rows = per_config(names, lambda name: bench_moe_forward(name, configs[name], anchors["rows"]),
                              out / "moe_forward.json")
        print(f"{'config':<18}{'ours fwd':>10}{'torch gmm':>11}{'ratio':>7}{'upstream*':>11}"
              f"{'vs up':>7}{'ours no_grad':>14}")
        for r in fwd_rows:
            up = r["upstream_fwd_tflops_anchor"]
            ours = r["sonicmoe_fwd_tflops"]
            mark = COMPILED_MARK if r["upstream_impl"] == "sonicmoe-upstream-compiled" else ""
            print(f"{r['config'] + mark:<18}{ours:>10.1f}{r['torch_grouped_mm_fwd_tflops']:>11.1f}"
                  f"{ours / r['torch_grouped_mm_fwd_tflops']:>7.3f}"
                  f"{(f'{up:.1f}' if up else '-'):>11}{(f'{ours / up:.3f}' if up else '-'):>7}"
                  f"{r['sonicmoe_no_grad_fwd_tflops']:>14.1f}")
        print("(forward TFLOP/s = 6*T*K*d*n / time; training forward: grad on; *upstream SonicMoE from "
              f"benchmarks/anchors; {COMPILED_MARK}: its torch.compile'd layer, where no eager figure exists; "
              f"activation {ACTIVATION}, the anchors' SwiGLU)\n")
    if "token_rounding" in ops:
        tr_rows = []
        for sweep, points in TOKEN_ROUNDING_SWEEPS.items():
            for cfg in points:
                tr_rows.append(dict(bench_token_rounding(cfg), sweep=sweep))
                torch.cuda.empty_cache()
        (out / "token_rounding.json").write_text(json.dumps({"rows": tr_rows}, indent=1))
        print(f"{'sweep':<24}{'E':>5}{'waste':>7}{'fwd topk':>10}{'fwd TR':>8}{'speedup':>9}"
              f"{'exp topk':>10}{'exp TR':>8}{'speedup':>9}{'gemm topk':>10}{'gemm TR':>8}{'speedup':>9}"
              f"{'bwd topk':>10}{'bwd TR':>8}{'f+b topk':>10}{'f+b TR':>8}")
        for r in tr_rows:
            print(f"{r['sweep']:<24}{r['E']:>5}{r['topk_padding_waste']:>7.3f}{r['topk_softmax_fwd_ms']:>10.3f}"
                  f"{r['token_rounding_fwd_ms']:>8.3f}{r['fwd_speedup']:>9.3f}"
                  f"{r['topk_softmax_experts_ms']:>10.3f}{r['token_rounding_experts_ms']:>8.3f}"
                  f"{r['experts_speedup']:>9.3f}{r['topk_softmax_gemms_ms']:>10.3f}"
                  f"{r['token_rounding_gemms_ms']:>8.3f}{r['gemms_speedup']:>9.3f}{r['topk_softmax_bwd_ms']:>10.3f}"
                  f"{r['token_rounding_bwd_ms']:>8.3f}{r['topk_softmax_fwd_bwd_ms']:>10.3f}"
                  f"{r['token_rounding_fwd_bwd_ms']:>8.3f}")
        print("(ms; forward under no_grad; exp = the forward's expert part from given routing decisions: "
              "sorted layout, K1, K2, K3; gemm = K1 + K2 alone over that layout (the kernel time); "
              "waste = top-K rows added by rounding counts up to 128, over T*K)\n")
    for op, (bench_fn, columns, note) in KERNEL_TABLES.items():
        if op not in ops:
            continue
        columns = [p for p in columns if not parts or p in parts]
        if not columns:
            continue
        kernel_rows = per_config(names, lambda name: bench_fn(name, configs[name], parts), out / f"{op}.json")
        print(f"{'config':<18}" + "".join(f"{p:>20}" for p in columns))
        for r in kernel_rows:
            print(f"{r['config']:<18}" + "".join(f"{r[p + '_us']:>10.0f} {r[p + '_tflops']:>6.1f} TF" for p in columns))
        print(f"(us and TFLOP/s per call; {note})\n")
        if MEASURE_ENERGY and not PROFILE_ONE_CALL:
            print(f"{'config':<18}" + "".join(f"{p:>29}" for p in columns))
            for r in kernel_rows:
                print(f"{r['config']:<18}" + "".join(f"{r[p + '_W']:>7.0f} W {r[p + '_pJ_per_flop']:>6.3f} pJ "
                                                     f"{r[p + '_MHz']:>4.0f} MHz" for p in columns))
            print("(the card's mean power and SM clock while each part runs back to back, and the energy per "
                  "call over its FLOPs, pJ per FLOP; NaN: the energy counter did not move)\n")
    if "moe_backward" in ops:
        bwd_rows = per_config(names, lambda name: bench_moe_backward(name, configs[name], anchors["rows"]),
                              out / "moe_backward.json")
        print(f"{'config':<18}{'bwd':>8}{'torch':>8}{'up*':>8}{'fwd+bwd':>9}{'torch':>8}{'up*':>8}"
              f"{'kept MiB':>10}{'torch':>9}{'up*':>9}{'peak MiB':>10}{'torch':>9}")
        fmt = lambda v, w, p=1: f"{v:>{w}.{p}f}" if v is not None else f"{'-':>{w}}"  # noqa: E731
        for r in bwd_rows:
            mark = COMPILED_MARK if r["upstream_impl"] == "sonicmoe-upstream-compiled" else ""
            print(f"{r['config'] + mark:<18}{fmt(r['sonicmoe_bwd_tflops'], 8)}{fmt(r['torch_grouped_mm_bwd_tflops'], 8)}"
                  f"{fmt(r['upstream_bwd_tflops_anchor'], 8)}{fmt(r['sonicmoe_fwd_bwd_tflops'], 9)}"
                  f"{fmt(r['torch_grouped_mm_fwd_bwd_tflops'], 8)}{fmt(r['upstream_fwd_bwd_tflops_anchor'], 8)}"
                  f"{fmt(r['sonicmoe_kept_MiB'], 10, 0)}{fmt(r['torch_grouped_mm_kept_MiB'], 9, 0)}"
                  f"{fmt(r['upstream_kept_MiB_anchor'], 9, 0)}{fmt(r['sonicmoe_step_peak_MiB'], 10, 0)}"
                  f"{fmt(r['torch_grouped_mm_step_peak_MiB'], 9, 0)}")
        print("(TFLOP/s: bwd = 12*T*K*d*n / (t_fwd+bwd - t_fwd), fwd+bwd = 18*T*K*d*n / t; kept = memory "
              "allocated after the forward minus its output; peak = a training step's peak above what was "
              "allocated before it, the gradients included; *upstream SonicMoE from benchmarks/anchors; "
              f"{COMPILED_MARK}: its torch.compile'd layer; activation {ACTIVATION}, the anchors' SwiGLU)\n")
        if MEASURE_ENERGY:
            print(f"{'config':<18}{'step W':>8}{'MHz':>6}{'fwd W':>7}{'MHz':>6}{'step J':>8}{'fwd J':>7}"
                  f"{'bwd J':>7}{'bwd pJ':>8}")
            for r in bwd_rows:
                print(f"{r['config']:<18}{r['sonicmoe_fwd_bwd_W']:>8.0f}{r['sonicmoe_fwd_bwd_MHz']:>6.0f}"
                      f"{r['sonicmoe_fwd_W']:>7.0f}{r['sonicmoe_fwd_MHz']:>6.0f}{r['sonicmoe_fwd_bwd_J']:>8.3f}"
                      f"{r['sonicmoe_fwd_J']:>7.3f}{r['sonicmoe_bwd_J']:>7.3f}{r['sonicmoe_bwd_pJ_per_flop']:>8.3f}")
            print("(sonicmoe.moe's training step and its forward run back to back: the card's mean power and SM "
                  "clock, the energy per call, and the backward's (step - forward) energy, also per FLOP)\n")
    if "activations" in ops:
        act_rows = per_config(names, lambda name: bench_activations(name, configs[name]), out / "activations.json")
        others = [a for a in sonicmoe.GLU_ACTIVATIONS if a != "swiglu"]
        print(f"{'config':<18}" + "".join(f"{'swiglu ' + k:>16}" for k in ("fwd", "bwd", "f+b"))
              + "".join(f"{a + ' ' + k + ' /sw':>17}" for a in others for k in ("fwd", "bwd", "f+b")))
        for r in act_rows:
            keys = ("fwd", "bwd", "fwd_bwd")
            print(f"{r['config']:<18}" + "".join(f"{r[f'swiglu_{k}_tflops']:>16.1f}" for k in keys)
                  + "".join(f"{r[f'{a}_{k}_tflops'] / r[f'swiglu_{k}_tflops']:>17.3f}" for a in others for k in keys))
        print("(sonicmoe.moe's TFLOP/s with SwiGLU, and GeGLU's and ReGLU's over SwiGLU's, same inputs, "
              "interleaved in one process; bwd = 12*T*K*d*n / (t_fwd+bwd - t_fwd))\n")
    if "moe_anchor_protocol" in ops:
        data = args.data or "anchor"
        _, timer = anchor_protocol_timer()
        card = {"before": card_matmul_tflops(timer)}
        proto_rows = per_config(names, lambda name: bench_moe_anchor_protocol(
            name, configs[name], anchors["rows"], rounds=args.rounds, data=data), out / "moe_anchor_protocol.json")
        card["after"] = card_matmul_tflops(timer)
        anchor_ceiling = anchors.get("ceilings", {}).get("dense_bf16_matmul_8192_tflops")
        (out / "moe_anchor_protocol.json").write_text(json.dumps(  # the rows again, the card's rates beside them
            {"card_matmul_tflops": card, "anchors_matmul_tflops": anchor_ceiling, "rows": proto_rows}, indent=1))
        print(f"{'config':<18}{'fwd':>8}{'up*':>8}{'vs up':>7}{'bwd':>8}{'up*':>8}{'vs up':>7}{'range':>13}"
              f"{'fwd+bwd':>9}{'up*':>8}{'vs up':>7}{'torch fwd':>10}{'bwd':>8}")
        for r in proto_rows:
            mark = COMPILED_MARK if r["upstream_impl"] == "sonicmoe-upstream-compiled" else ""
            ours = {k: r[f"sonicmoe_{k}_tflops"] for k in ("fwd", "bwd", "fwd_bwd")}
            up = {k: r[f"upstream_{k}_tflops_anchor"] for k in ("fwd", "bwd", "fwd_bwd")}
            ratio = lambda k: f"{ours[k] / up[k]:>7.3f}" if up[k] else f"{'-':>7}"  # noqa: E731
            bwd_rounds = [v / up["bwd"] for v in r["sonicmoe_bwd_tflops_rounds"]] if up["bwd"] else [float("nan")]
            print(f"{r['config'] + mark:<18}{ours['fwd']:>8.1f}{up['fwd'] or float('nan'):>8.1f}{ratio('fwd')}"
                  f"{ours['bwd']:>8.1f}{up['bwd'] or float('nan'):>8.1f}{ratio('bwd')}"
                  f"{f'{min(bwd_rounds):.3f}-{max(bwd_rounds):.3f}':>13}"
                  f"{ours['fwd_bwd']:>9.1f}{up['fwd_bwd'] or float('nan'):>8.1f}{ratio('fwd_bwd')}"
                  f"{r['torch_grouped_mm_fwd_tflops']:>10.1f}{r['torch_grouped_mm_bwd_tflops']:>8.1f}")
        print(f"(TFLOP/s timed as the anchors' upstream figures: {proto_rows[0]['timer'] if proto_rows else '-'}, "
              f"warmup {ANCHOR_PROTOCOL['warmup_ms']:g} ms, rep {ANCHOR_PROTOCOL['rep_ms']:g} ms, mean, L2 flushed "
              f"before each call, after {ANCHOR_PROTOCOL['idle_s']:g} s idle; bwd = 12 T K d n / (t_fwd+bwd - t_fwd); "
              f"data {data}; medians of {args.rounds} rounds, range = bwd / up* over the rounds; "
              f"*upstream SonicMoE from benchmarks/anchors; {COMPILED_MARK}: its torch.compile'd layer)\n")
        print(card_speed_line(card, anchor_ceiling) + "\n")
    if "grouped_gemm" not in ops:
        return
    rows = []
    for name in names:
        rows.append(bench_down_projection(name, configs[name], tiles))
        torch.cuda.empty_cache()

    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "anchors": str(anchors_path.name),
        "ceilings": anchors.get("ceilings"),
        "benchmark": "down-projection grouped GEMM",
        "rows": rows,
    }
    (out / "grouped_gemm.json").write_text(json.dumps(result, indent=1))
    plot(rows, out / "grouped_gemm.png")

    header = f"{'config':<18}{'M_total':>8}{'k':>6}{'n_out':>6}{'E':>5}{'torch':>8}{'ours':>8}{'ratio':>7}{'err':>9}"
    extra = [t for t in tiles if t != "auto"]
    print(header + "".join(f"{t[:14]:>16}" for t in extra))
    for r in rows:
        line = (f"{r['config']:<18}{r['M_total']:>8}{r['k']:>6}{r['n_out']:>6}{r['E']:>5}"
                f"{r['torch_grouped_mm_tflops']:>8.1f}{r['sonicmoe_auto_tflops']:>8.1f}"
                f"{r['ratio_auto_vs_torch']:>7.3f}{r['sonicmoe_auto_rel_err']:>9.1e}")
        print(line + "".join(f"{r[f'sonicmoe_{t}_tflops']:>16.1f}" for t in extra))
    print(f"(TFLOP/s, bf16; ratio = ours/torch; JSON and PNG in {out})")


if __name__ == "__main__":
    main()
