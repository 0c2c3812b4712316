"""The neighbour effect (sessions 29-30): K4's time per call, iteration by iteration, after
different predecessors (itself, 12 ping-pong K4s, 12 K6s, 30 ms idle). A reading that drifts
over tens of calls is the card's power control remembering what ran before, not the kernel.

    python experiments/power_history_ramp.py olmoe-1b-7b
"""
import pathlib
import statistics
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "benchmarks")]
import bench  # noqa: E402
from sonicmoe._ops import down_proj_grad, grouped_gemm_kn  # noqa: E402

_, _, CONFIGS = bench.load_anchors()
bench.warm_up_gpu()
name = sys.argv[1]
i = bench.backward_inputs(CONFIGS[name])
args = (i["d_out"], i["w2"], i["h"], i["row_score"], i["off"], i["g"])
k4 = lambda: down_proj_grad(*args)  # noqa: E731
k4_pp = lambda: down_proj_grad(*args, tile_config=bench.VARLEN_PP)  # noqa: E731
k6 = lambda: grouped_gemm_kn(i["d_h"], i["w1"], i["off"])  # noqa: E731
bench.time_ms(k4, warmup=3, iters=5)
idle_cycles = int(30e-3 * 1.98e9)  # torch.cuda._sleep counts SM cycles
predecessors = {"K4 itself": (lambda: None, 0), "K4_pp x12": (k4_pp, 12), "K6 x12": (k6, 12),
                "idle 30 ms": (lambda: torch.cuda._sleep(idle_cycles), 1)}
calls, reps = 30, 6
print(f"== {name}: K4 auto per call (us), median over {reps} repetitions; calls 1-12, then 13-30's median")
for label, (pred, count) in predecessors.items():
    runs = []
    for _ in range(reps):
        for _ in range(count):
            pred()
        events = [torch.cuda.Event(enable_timing=True) for _ in range(calls + 1)]
        events[0].record()
        for c in range(calls):
            k4()
            events[c + 1].record()
        torch.cuda.synchronize()
        runs.append([events[c].elapsed_time(events[c + 1]) * 1e3 for c in range(calls)])
    med = [statistics.median(r[c] for r in runs) for c in range(calls)]
    print(f"{label:<12}" + " ".join(f"{v:5.0f}" for v in med[:12]) + f" | {statistics.median(med[12:]):5.0f}")
