"""The side-by-side comparison: upstream SonicMoE (its eager layer), sonicmoe.moe and a
torch._grouped_mm layer built and timed in one process on one card, in interleaved rounds (each
round: the median of 10 CUDA-event-timed calls after 3; the figure: the median over rounds), and
the memory each keeps after its forward. The ratio project / upstream from one process on one
card is the figure every speed claim of the project cites; absolute TFLOP/s move 1-5% between
two starts of the same card. The layers take turns in a rotating order, and each ratio is the
median over rounds of the two layers' ratio within a round (paired_ratios), printed with its
range over the rounds.

  python3 benchmarks/sidebyside.py [config ...]        (or: benchmarks/bench.py --ops sidebyside)
  env: IMPLS=upstream,project,torch   ROUNDS=3   OUT=dir (writes sidebyside.json)
       ACTIVATION=swiglu|geglu|reglu: the experts' gated activation of the project and torch layers
       (default swiglu); upstream is timed with SwiGLU only, so another activation leaves it out
       PROFILE=1: also each layer's kernels in one forward + backward (torch.profiler), per config,
       for the kernel-by-kernel table of docs/performance.md
       ENERGY=1: also each layer's forward and forward + backward run back to back for 0.6 s (after
       0.2 s), interleaved, 3 rounds: the card's mean power, SM clock, time and energy per call
       there (NVML's energy counter, as bench.py --energy): at the power cap a training step's
       speed is its energy per call, so this ratio is the one a long run sees
       NCU=1: no timing; each layer's forward + backward once between cudaProfilerStart / Stop after
       its warm-up, for Nsight Compute started with collection off (scripts/ncu_parts.sh --sidebyside)
The table also gives each layer's GPU time (ms, median) beside its host time to issue the same
work (host_issue_ms): a layer whose host time nears its GPU time is host-bound.

Configs: the paper's and the anchors' eight, then MODELS (other released MoE models' shapes);
`all` runs both lists. Upstream SonicMoE is imported as `upstream_sonicmoe` (its Dec-2025 sources
with the package and its torch.library namespace renamed, so it loads beside this project; it needs
nvidia-cutlass-dsl 4.2.1 and quack). Where it is not importable the harness says so and times the
project and the torch layer alone. On an 80 GB card deepseek-v3 fits with IMPLS=project,upstream
(not with the torch layer resident too).
"""

from __future__ import annotations

import json
import os
import pathlib
import statistics
import sys
import time
import traceback

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench import energy_interleaved, kept_mib, profile_one_call, torch_grouped_mm_layer  # noqa: E402

# (name, T, d, n, E, K): the paper's Table 9b shapes and the anchors' real models.
CONFIGS = [
    ("paper-7b-n256", 24576, 1536, 256, 128, 8),
    ("paper-7b-n1024", 24576, 1536, 1024, 32, 2),
    ("paper-30b-n512", 32768, 4096, 512, 128, 8),
    ("paper-120b-n1024", 32768, 4096, 1024, 128, 8),
    ("olmoe-1b-7b", 32768, 2048, 1024, 64, 8),
    ("qwen3-30b-a3b", 32768, 2048, 768, 128, 8),
    ("qwen3-235b-a22b", 32768, 4096, 1536, 128, 8),
    ("deepseek-v3", 16384, 7168, 2048, 256, 8),
]
# Other released MoE models' (d, n, E, K) from their published configs, at T 32768 (16384 where
# the layer's H alone passes 4 GB).
MODELS = [
    ("mixtral-8x7b", 16384, 4096, 14336, 8, 2),
    ("qwen2-57b-a14b", 32768, 3584, 2560, 64, 8),
    ("deepseek-v2-lite", 32768, 2048, 1408, 64, 6),
    ("qwen1.5-moe-a2.7b", 32768, 2048, 1408, 60, 4),
    ("gpt-oss-20b", 32768, 2880, 2880, 32, 4),
]
dev, dt = "cuda", torch.bfloat16
UPSTREAM_HOWTO = ("upstream SonicMoE is not importable as upstream_sonicmoe: put its sources (package renamed "
                  "upstream_sonicmoe, its torch.library namespace too), quack at the commit upstream pins and "
                  "nvidia-cutlass-dsl 4.2.1 on PYTHONPATH")


def bench(fn, warm=3, rep=10):
    """The median of rep CUDA-event-timed calls after warm calls, in ms."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rep):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def host_issue_ms(fn, reps=5):
    """The host's time to issue fn's work, ms (median of reps), with the GPU held busy by a sleep
    kernel queued first, so that no launch waits for the GPU. Where it nears fn's GPU time the layer
    is host-bound (its kernels wait for their launches); a host sync inside fn shows as the sleep's
    length (~0.1 s)."""
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        torch.cuda._sleep(200_000_000)  # GPU clock cycles: ~0.1 s, longer than any layer's host time
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(times)


def upstream_available():
    try:
        import upstream_sonicmoe  # noqa: F401
    except ImportError:
        return False
    return True


def upstream_fns(T, d, n, E, K):
    from upstream_sonicmoe import MoE
    from upstream_sonicmoe.enums import ActivationType
    from upstream_sonicmoe.functional import moe_TC_softmax_topk_layer

    moe = MoE(num_experts=E, num_experts_per_tok=K, hidden_size=d, intermediate_size=n,
              activation_function=ActivationType.SWIGLU, add_bias=False, std=0.02).to(dev, dt)
    x = (0.5 * torch.randn(T, d, device=dev, dtype=dt)).requires_grad_()
    dy = torch.randn_like(x)
    w1, w2, rw = moe.c_fc.weight, moe.c_proj.weight, moe.router.weight

    def fwd():
        return moe_TC_softmax_topk_layer(x, rw, w1.permute(1, 2, 0), None, w2.permute(1, 2, 0), None,
                                         K, moe.stream_id, ActivationType.SWIGLU, False)[0]

    def fwd_bwd():
        fwd().backward(dy)
        x.grad = w1.grad = w2.grad = rw.grad = None

    return fwd, fwd_bwd


def layer_tensors(T, d, n, E):
    x = (torch.randn(T, d, device=dev) * 0.5).to(dt).requires_grad_()
    rw = (torch.randn(E, d, device=dev) * d**-0.5).to(dt).requires_grad_()
    w1 = (torch.randn(E, 2 * n, d, device=dev) * d**-0.5).to(dt).requires_grad_()
    w2 = (torch.randn(E, d, n, device=dev) * n**-0.5).to(dt).requires_grad_()
    return x, rw, w1, w2, torch.randn(T, d, device=dev).to(dt)


def project_fns(T, d, n, E, K, activation="swiglu"):
    import sonicmoe

    x, rw, w1, w2, dy = layer_tensors(T, d, n, E)

    def fwd():
        return sonicmoe.moe(x, rw, w1, w2, K, routing="topk_softmax", activation=activation)

    def fwd_bwd():
        fwd().backward(dy)
        x.grad = rw.grad = w1.grad = w2.grad = None

    return fwd, fwd_bwd


def torch_fns(T, d, n, E, K, activation="swiglu"):

    x, rw, w1, w2, dy = layer_tensors(T, d, n, E)

    def fwd():
        return torch_grouped_mm_layer(x, rw, w1, w2, K, activation)

    def fwd_bwd():
        fwd().backward(dy)
        x.grad = rw.grad = w1.grad = w2.grad = None

    return fwd, fwd_bwd


IMPLS = {"upstream": upstream_fns, "project": project_fns, "torch": torch_fns}
# The project's gated activations (sonicmoe.GLU_ACTIVATIONS), env ACTIVATION.
ACTIVATIONS = ("swiglu", "geglu", "reglu")


def kernel_table(fwd_bwd):
    """Each GPU kernel of one forward + backward (after the timed rounds' warm-up), in start order:
    name, µs, start µs (from the first kernel), stream; so that two layers' kernels pair call by
    call."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fwd_bwd()
        torch.cuda.synchronize()
    events = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time > 0),
                    key=lambda e: e.time_range.start)
    t0 = events[0].time_range.start if events else 0
    return [{"kernel": e.name, "us": round(e.device_time, 1), "start_us": round(e.time_range.start - t0, 1),
             "stream": getattr(e, "device_resource_id", None)} for e in events]


def rotated(names, r):
    """Round r's order: each round starts one further on, so that no layer always runs right after
    the other's forward + backward (the card's power control remembers the last ~75 ms of load)."""
    return names[r % len(names):] + names[:r % len(names)]


def paired_ratios(ours, other):
    """Per round, ours over other of the forward, backward and forward + backward TFLOP/s (the
    inverse ratio of their times; the backward's time is fwd_bwd - fwd), from the two layers'
    {"f": [ms per round], "fb": [...]}: both timed within the same round, so that a drift of the
    card's clock across rounds cancels in each ratio. The figure is their median."""
    out = {"fwd_tflops": [], "bwd_tflops": [], "fwd_bwd_tflops": []}
    for f, fb, f_o, fb_o in zip(ours["f"], ours["fb"], other["f"], other["fb"]):
        out["fwd_tflops"].append(f_o / f)
        out["bwd_tflops"].append((fb_o - f_o) / (fb - f))
        out["fwd_bwd_tflops"].append(fb_o / fb)
    return out


def sustained(fns, ms):
    """Per layer and call (fwd, fwd_bwd): mean power (W), SM clock (MHz), time (ms) and energy (J)
    per call while it runs back to back (bench.energy_interleaved); ms: {impl: (fwd, fwd_bwd) ms}."""
    calls, call_ms = {}, {}
    for impl, (fwd, fwd_bwd) in fns.items():
        for kind, fn, t in (("fwd", fwd, ms[impl][0]), ("fwd_bwd", fwd_bwd, ms[impl][1])):
            calls[impl, kind], call_ms[impl, kind] = fn, t
    readings = energy_interleaved(calls, call_ms)
    out = {impl: {} for impl in fns}
    for (impl, kind), (watts, mhz, call_ms) in readings.items():
        out[impl].update({f"{kind}_W": watts, f"{kind}_MHz": mhz, f"{kind}_ms": call_ms,
                          f"{kind}_J": watts * call_ms / 1e3})
    return out


def measure(config, impls, rounds, profile_kernels=False, activation="swiglu", ncu_range=False, energy=False):
    name, T, d, n, E, K = config
    row = {"config": name, "shape": [T, d, n, E, K], "activation": activation}
    flops = 6 * T * K * d * n
    fns, times = {}, {i: {"f": [], "fb": []} for i in impls}
    for impl in impls:
        t0 = time.time()
        try:
            fns[impl] = IMPLS[impl](T, d, n, E, K) if impl == "upstream" else IMPLS[impl](T, d, n, E, K, activation)
            fns[impl][1]()  # builds / JIT-compiles, warms up
            torch.cuda.synchronize()
            row[f"{impl}_kept_MiB"] = kept_mib(fns[impl][0])
        except Exception as ex:  # one layer failing (e.g. out of memory) leaves the others' figures
            traceback.print_exc()
            fns.pop(impl, None)
            row[f"{impl}_error"] = repr(ex)[:300]
        row[f"{impl}_setup_s"] = round(time.time() - t0, 1)
    if ncu_range:  # one forward + backward per layer inside the profiler's range, nothing timed
        row["profiled_ms"] = profile_one_call({impl: fwd_bwd for impl, (_, fwd_bwd) in fns.items()})
        return row
    for r in range(rounds):
        for impl in rotated(list(fns), r):
            fwd, fwd_bwd = fns[impl]
            times[impl]["f"].append(bench(fwd))
            times[impl]["fb"].append(bench(fwd_bwd))
    host = {impl: (host_issue_ms(fwd), host_issue_ms(fwd_bwd)) for impl, (fwd, fwd_bwd) in fns.items()}
    if energy:
        medians = {impl: tuple(statistics.median(times[impl][k]) for k in ("f", "fb")) for impl in fns}
        row["sustained"] = sustained(fns, medians)
        if "project" in fns and "upstream" in fns:
            ours, up = row["sustained"]["project"], row["sustained"]["upstream"]
            row["project_over_upstream_sustained"] = {
                f"{kind}_{q}": up[f"{kind}_{q}"] / ours[f"{kind}_{q}"]
                for kind in ("fwd", "fwd_bwd") for q in ("ms", "J")}
    if profile_kernels:
        for impl, (_, fwd_bwd) in fns.items():
            row[f"{impl}_kernels"] = kernel_table(fwd_bwd)
    for impl in fns:
        f_ms, fb_ms = statistics.median(times[impl]["f"]), statistics.median(times[impl]["fb"])
        row[impl] = {"fwd_ms": f_ms, "fwd_bwd_ms": fb_ms, "fwd_tflops": flops / f_ms / 1e9,
                     "bwd_tflops": 2 * flops / (fb_ms - f_ms) / 1e9, "fwd_bwd_tflops": 3 * flops / fb_ms / 1e9,
                     "rounds_fwd_ms": times[impl]["f"], "rounds_fwd_bwd_ms": times[impl]["fb"],
                     "host_fwd_ms": host[impl][0], "host_fwd_bwd_ms": host[impl][1]}
    for other in ("upstream", "torch"):
        if other in row and "project" in row:
            per_round = paired_ratios(times["project"], times[other])
            row[f"project_over_{other}_rounds"] = per_round
            row[f"project_over_{other}"] = {k: statistics.median(v) for k, v in per_round.items()}
    del fns
    torch.cuda.empty_cache()
    return row


def print_kernels(row, impls, top=12):
    for impl in impls:
        table = row.get(f"{impl}_kernels")
        if table:
            by_name = {}
            for k in table:
                calls_us = by_name.setdefault(k["kernel"], [0, 0.0])
                calls_us[0] += 1
                calls_us[1] += k["us"]
            print(f"-- {row['config']} {impl}: {sum(k['us'] for k in table):.0f} µs of kernels in one forward + backward")
            for name, (calls, us) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]:
                print(f"   {us:9.1f} µs {calls:4d}x  {name[:110]}")


def print_table(result, impls):
    print(f"\n{result['device']}, commit {result['commit']}, {result['when']}, {result.get('activation', 'swiglu')}; "
          "dense bf16 8192^3 "
          f"{result['dense_tflops_before']:.0f} -> {result['dense_tflops_after']:.0f} TFLOP/s")
    print(f"{'config':<20}{'impl':<10}{'fwd':>6}{'bwd':>6}{'f+b':>6}{'kept MiB':>10}   ms GPU / host: fwd, f+b")
    for r in result["rows"]:
        for impl in impls:
            if impl in r:
                x = r[impl]
                print(f"{r['config']:<20}{impl:<10}{x['fwd_tflops']:6.0f}{x['bwd_tflops']:6.0f}"
                      f"{x['fwd_bwd_tflops']:6.0f}{r[impl + '_kept_MiB']:10.0f}   {x['fwd_ms']:.2f} / "
                      f"{x.get('host_fwd_ms', float('nan')):.2f}, {x['fwd_bwd_ms']:.2f} / "
                      f"{x.get('host_fwd_bwd_ms', float('nan')):.2f}")
            elif f"{impl}_error" in r:
                print(f"{r['config']:<20}{impl:<10} ERROR {r[impl + '_error'][:80]}")
        for other in ("upstream", "torch"):
            q = r.get(f"project_over_{other}")
            if q:
                spread = r.get(f"project_over_{other}_rounds", {})
                span = {k: f" ({min(v):.3f}-{max(v):.3f})" if len(v) > 1 else "" for k, v in spread.items()}
                print(f"{'':<20}project / {other}: " + "  ".join(
                    f"{label} {q[k]:.3f}{span.get(k, '')}"
                    for label, k in (("fwd", "fwd_tflops"), ("bwd", "bwd_tflops"), ("fwd+bwd", "fwd_bwd_tflops"))))
        for impl, x in r.get("sustained", {}).items():
            print(f"{'':<20}{impl:<10}sustained: fwd {x['fwd_ms']:.2f} ms {x['fwd_J']:.2f} J {x['fwd_W']:.0f} W "
                  f"{x['fwd_MHz']:.0f} MHz; f+b {x['fwd_bwd_ms']:.2f} ms {x['fwd_bwd_J']:.2f} J "
                  f"{x['fwd_bwd_W']:.0f} W {x['fwd_bwd_MHz']:.0f} MHz")
        q = r.get("project_over_upstream_sustained")
        if q:
            print(f"{'':<20}project / upstream sustained (upstream's time or energy a call over ours): "
                  f"fwd {q['fwd_ms']:.3f} time, {q['fwd_J']:.3f} energy; fwd+bwd {q['fwd_bwd_ms']:.3f} time, "
                  f"{q['fwd_bwd_J']:.3f} energy")


def run(names=(), impls=None, rounds=None, out_dir=None, commit=None, activation=None):
    """Times the named configs (default the eight; 'all' adds MODELS) and writes sidebyside.json."""
    impls = impls or os.environ.get("IMPLS", "upstream,project,torch").split(",")
    unknown = set(impls) - set(IMPLS)
    if unknown:
        raise ValueError(f"IMPLS = {','.join(impls)}: unknown {sorted(unknown)}; must be among {sorted(IMPLS)}")
    activation = activation or os.environ.get("ACTIVATION", "swiglu")
    if activation not in ACTIVATIONS:
        raise ValueError(f"ACTIVATION = {activation!r} breaks the rule: must be one of {', '.join(ACTIVATIONS)}")
    if activation != "swiglu" and "upstream" in impls:
        print(f"ACTIVATION = {activation}: upstream SonicMoE is timed with SwiGLU only; timing "
              + ", ".join(i for i in impls if i != "upstream") + " alone")
        impls = [i for i in impls if i != "upstream"]
    if "upstream" in impls and not upstream_available():
        print(UPSTREAM_HOWTO + "; timing " + ", ".join(i for i in impls if i != "upstream") + " alone")
        impls = [i for i in impls if i != "upstream"]
    rounds = rounds or int(os.environ.get("ROUNDS", "3"))
    profile_kernels = os.environ.get("PROFILE", "") not in ("", "0")
    ncu_range = os.environ.get("NCU", "") not in ("", "0")
    energy = os.environ.get("ENERGY", "") not in ("", "0")
    known = {c[0]: c for c in CONFIGS + MODELS}
    names = list(names) or [c[0] for c in CONFIGS]
    if "all" in names:
        names = [c[0] for c in CONFIGS + MODELS]
    missing = [n for n in names if n not in known]
    if missing:
        raise ValueError(f"configs {missing} are unknown; must be among {sorted(known)} or 'all'")
    result = {"commit": commit or os.environ.get("PROJECT_COMMIT", "?"), "when": time.strftime("%Y-%m-%d %H:%M"),
              "device": torch.cuda.get_device_name(), "torch": torch.__version__, "rounds": rounds,
              "activation": activation, "rows": []}
    path = pathlib.Path(out_dir or os.environ.get("OUT", "bench-out")) / "sidebyside.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    a = torch.randn(8192, 8192, device=dev, dtype=dt)
    result["dense_tflops_before"] = 2 * 8192**3 / bench(lambda: a @ a, 5, 20) / 1e9
    for name in names:
        row = measure(known[name], impls, rounds, profile_kernels, activation, ncu_range, energy)
        result["rows"].append(row)
        print(json.dumps({k: v for k, v in row.items() if not k.endswith("_kernels")}), flush=True)
        print_kernels(row, impls)
        path.write_text(json.dumps(result, indent=1))
    result["dense_tflops_after"] = 2 * 8192**3 / bench(lambda: a @ a, 5, 20) / 1e9
    path.write_text(json.dumps(result, indent=1))
    if not ncu_range:
        print_table(result, impls)
    return result


if __name__ == "__main__":
    if not torch.cuda.is_available():
        sys.exit("sidebyside.py needs a CUDA GPU")
    run(sys.argv[1:])
