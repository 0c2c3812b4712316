"""Which stage of token rounding's eager forward runs longer than its kernels? (T 16384, d 1536,
n 256, K 8.) forward_host_gap.py found rounding's eager forward 33-81 µs over its CUDA-graph
replay where top-K's is level, and no host call waiting on the GPU (session 19). Here the
forward's stages run by hand, as sonicmoe.moe runs them, back to back with a CUDA event between
each two (router GEMM, rounding_probs, token_rounding_assign, dense_layout, K1, K2, combine_csr):
each stage's median event time beside its kernels' profiled time, the by-hand total beside
sonicmoe.moe's eager time and its graph replay, interleaved.

    python experiments/forward_stage_events.py [E ...]   # default: 64 512
"""
import statistics
import sys

import torch
import torch.nn.functional as F
sys.path.insert(0, "python")  # run from the repository root
sys.path.insert(0, "benchmarks")
import sonicmoe
from sonicmoe._ops import combine_csr, grouped_gemm, rounding_probs, token_rounding_assign, up_proj
from sonicmoe.routing import dense_routing_metadata_expert_major, dense_row_bound
from bench import cuda_events, graph_time_ms, layer_params, time_ms, warm_up_gpu

T, d, n, K, TILE = 16384, 1536, 256, 8, 128
STAGES = ("router GEMM", "rounding_probs", "assign", "dense_layout", "K1 up_proj", "K2 grouped_gemm", "combine_csr")


def by_hand(x, router, w1, w2, E, events=None):
    """sonicmoe.moe's token rounding forward (no_grad) stage by stage; events: 8 CUDA events
    recorded around the 7 stages."""
    mark = (lambda i: events[i].record()) if events else (lambda i: None)
    bound = dense_row_bound(T, E, K, TILE)
    with torch.no_grad():
        mark(0)
        logits = F.linear(x, router)
        mark(1)
        _, probs_t, chosen_t = rounding_probs(logits.contiguous(), K, False)
        mark(2)
        assigned_t, _ = token_rounding_assign(probs_t, chosen_t, TILE, 0)
        mark(3)
        meta = dense_routing_metadata_expert_major(probs_t, assigned_t, bound)
        mark(4)
        _, a = up_proj(x, w1, meta.expert_offsets, meta.gather_idx, keep_h=False, partial_rows=True)
        mark(5)
        y = grouped_gemm(a, w2, meta.expert_offsets, tile_config="varlen_pingpong_128x128x64", partial_rows=True)
        mark(6)
        out = combine_csr(y, meta.row_scores, meta.rows, meta.token_offsets)
        mark(7)
    return out


warm_up_gpu()
for E in [int(a) for a in sys.argv[1:]] or [64, 512]:
    x, router, w1, w2 = layer_params(T, d, n, E)

    def layer():
        with torch.no_grad():
            return sonicmoe.moe(x, router, w1, w2, K, routing="token_rounding", tile=TILE)

    def hand():
        return by_hand(x, router, w1, w2, E)

    iters = 30
    stage_us = {s: [] for s in STAGES}
    totals = {"layer eager": [], "by hand eager": [], "by hand, stage events": [], "layer graph": [],
              "by hand graph": []}
    for _ in range(3):
        totals["layer eager"].append(time_ms(layer, warmup=3, iters=iters) * 1e3)
        totals["by hand eager"].append(time_ms(hand, warmup=3, iters=iters) * 1e3)
        marks = [[torch.cuda.Event(enable_timing=True) for _ in range(8)] for _ in range(iters)]
        for i in range(3):
            by_hand(x, router, w1, w2, E)
        for ev in marks:
            by_hand(x, router, w1, w2, E, ev)
        torch.cuda.synchronize()
        for s, name in enumerate(STAGES):
            stage_us[name].append(statistics.median(ev[s].elapsed_time(ev[s + 1]) for ev in marks) * 1e3)
        totals["by hand, stage events"].append(statistics.median(ev[0].elapsed_time(ev[7]) for ev in marks) * 1e3)
        totals["layer graph"].append(graph_time_ms(layer) * 1e3)
        totals["by hand graph"].append(graph_time_ms(hand) * 1e3)
    kernels = [(e.name, e.device_time) for e in cuda_events(hand)]
    print(f"== E {E}: " + ", ".join(f"{k} {statistics.median(v):.1f}" for k, v in totals.items()) + " µs")
    print(f"   stages (median event µs): " + ", ".join(f"{k} {statistics.median(v):.1f}" for k, v in stage_us.items()))
    print(f"   kernels of one by-hand call (µs): " + ", ".join(f"{name.split('(')[0][-40:]} {t:.1f}" for name, t in kernels))
    del x, router, w1, w2
    torch.cuda.empty_cache()
