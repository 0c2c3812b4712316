"""Which stage of the eager forward runs longer than its kernels, token rounding against top-K?
(T 16384, d 1536, n 256, K 8.) forward_host_gap.py found rounding's eager forward 33-81 µs over
its CUDA-graph replay where top-K's is level, and no host call waiting on the GPU (session 19).
Here each routing's forward runs by hand, stage by stage as sonicmoe.moe runs it, back to back
with a CUDA event between each two (rounding: router GEMM, rounding_probs, token_rounding_assign,
dense_layout, K1, K2, combine_csr; top-K: router GEMM, router_topk, the routing metadata, K1, K2,
combine): each stage's median event time beside its kernels' profiled time, the by-hand total
beside sonicmoe.moe's eager time and its graph replay, interleaved.

    python experiments/forward_stage_events.py [E ...]   # default: 64 512
"""
import statistics
import sys

import torch
import torch.nn.functional as F
sys.path.insert(0, "python")  # run from the repository root
sys.path.insert(0, "benchmarks")
import sonicmoe
from sonicmoe._ops import (combine, combine_csr, device_routing_metadata, grouped_gemm, rounding_probs,
                          token_rounding_assign, up_proj)
from sonicmoe.routing import dense_routing_metadata_expert_major, dense_row_bound
from bench import cuda_events, graph_time_ms, layer_params, time_ms, warm_up_gpu

T, d, n, K, TILE = 16384, 1536, 256, 8, 128
STAGES = {"token_rounding": ("router GEMM", "rounding_probs", "assign", "dense_layout", "K1 up_proj",
                             "K2 grouped_gemm", "combine_csr"),
          "topk_softmax": ("router GEMM", "router_topk", "metadata", "K1 up_proj", "K2 grouped_gemm", "combine")}


def rounded_by_hand(x, router, w1, w2, E, events=None):
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


def topk_by_hand(x, router, w1, w2, E, events=None):
    """sonicmoe.moe's top-K forward (no_grad; _MoELayer's steps) stage by stage; events: 7 CUDA
    events recorded around the 6 stages."""
    mark = (lambda i: events[i].record()) if events else (lambda i: None)
    with torch.no_grad():
        mark(0)
        logits = F.linear(x, router)
        mark(1)
        scores, experts = sonicmoe.router_topk(logits, K, "topk_softmax")
        mark(2)
        meta = device_routing_metadata(experts, E)
        mark(3)
        _, a = up_proj(x, w1, meta.expert_offsets, meta.gather_idx, keep_h=False)
        mark(4)
        y = grouped_gemm(a, w2, meta.expert_offsets)
        mark(5)
        out = combine(y, scores, meta.rev_idx)
        mark(6)
    return out


BY_HAND = {"token_rounding": rounded_by_hand, "topk_softmax": topk_by_hand}


warm_up_gpu()
for E in [int(a) for a in sys.argv[1:]] or [64, 512]:
    x, router, w1, w2 = layer_params(T, d, n, E)
    iters = 30
    stage_us = {r: {s: [] for s in STAGES[r]} for r in STAGES}
    totals = {r: {"layer eager": [], "by hand eager": [], "by hand, stage events": [], "layer graph": [],
                  "by hand graph": []} for r in STAGES}
    fns = {}
    for routing in STAGES:
        def layer(routing=routing):
            with torch.no_grad():
                return sonicmoe.moe(x, router, w1, w2, K, routing=routing, tile=TILE)

        def hand(routing=routing):
            return BY_HAND[routing](x, router, w1, w2, E)
        fns[routing] = (layer, hand)
    for _ in range(3):  # the routings alternate, so drift hits both
        for routing, (layer, hand) in fns.items():
            marks_per_call = len(STAGES[routing]) + 1
            t = totals[routing]
            t["layer eager"].append(time_ms(layer, warmup=3, iters=iters) * 1e3)
            t["by hand eager"].append(time_ms(hand, warmup=3, iters=iters) * 1e3)
            marks = [[torch.cuda.Event(enable_timing=True) for _ in range(marks_per_call)] for _ in range(iters)]
            for _ in range(3):
                hand()
            for ev in marks:
                BY_HAND[routing](x, router, w1, w2, E, ev)
            torch.cuda.synchronize()
            for s, name in enumerate(STAGES[routing]):
                stage_us[routing][name].append(statistics.median(ev[s].elapsed_time(ev[s + 1]) for ev in marks) * 1e3)
            t["by hand, stage events"].append(statistics.median(ev[0].elapsed_time(ev[-1]) for ev in marks) * 1e3)
            t["layer graph"].append(graph_time_ms(layer) * 1e3)
            t["by hand graph"].append(graph_time_ms(hand) * 1e3)
    for routing, (layer, hand) in fns.items():
        kernels = [(e.name, e.device_time) for e in cuda_events(hand)]
        print(f"== E {E} {routing}: " + ", ".join(f"{k} {statistics.median(v):.1f}" for k, v in totals[routing].items())
              + " µs")
        print("   stages (median event µs): " + ", ".join(f"{k} {statistics.median(v):.1f}"
                                                       for k, v in stage_us[routing].items()))
        print("   kernels of one by-hand call (µs): " + ", ".join(f"{name.split('(')[0][-40:]} {t:.1f}"
                                                             for name, t in kernels))
    del x, router, w1, w2
    torch.cuda.empty_cache()
