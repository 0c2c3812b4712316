"""Bound on folding the router's part of dx into K6's epilogue (docs/perf-notes.md, session 41).

Where the scores are a softmax over the chosen logits (topk_softmax, the anchors' mode), d_logits
is zero off the chosen experts, so the router's part of dx, d_logits @ router_weight, could be
added row by row in K6's epilogue (d_logits[r] * router_weight[e] on sorted row r of expert e)
instead of the dense cuBLAS GEMM and its T x d addend, which K8 (combine_dx) reads. This probe
times the layer with that part of dx left out (wrong dx by design; R's backward and the router
weight's GEMM still run in the tail): what the fold could remove at most, before its own cost
(R's backward before K6, the epilogue's extra FMA an element).

Timed as the anchors' protocol, the variants alternating in one process:
  base        the layer with the dense d_logits @ router_weight added in K8 (_ROUTER_DX_IN_K6 off)
  no_router   the same backward without d_logits @ router_weight and K8's addend (the bound)
  in_k6       the fold as built (session 42): R's backward before K6, whose epilogue adds
              d_logits[t, e] * router_weight[e] (grouped_gemm_kn's addend; _ROUTER_DX_IN_K6 on)

    python experiments/router_fold_bound.py [--rounds 5] [--trace] [CONFIG ...]

--trace prints one backward's kernels per variant first (R's backward, K6 with and without the
addend, the tail's kernels). One call under the profiler is not steady: it places R's backward
and times it, but K6's addend moves less than the call-to-call spread (session 47).
"""
import argparse
import sys

import torch

sys.path.insert(0, "python")
sys.path.insert(0, "benchmarks")
import bench  # noqa: E402
import sonicmoe  # noqa: E402
from sonicmoe import functional  # noqa: E402

BASE_BACKWARD = functional._MoELayer.backward
DEFAULT_IN_K6 = functional._ROUTER_DX_IN_K6


def backward_without_router_dx(ctx, grad_out, grad_logits=None):
    """_MoELayer.backward with the router's part of dx left out (a probe)."""
    x, router_weight, w1, w2, logits, scores, experts, h, offsets, gather_idx, rev_idx = ctx.saved_tensors
    need_x, need_router, need_w1, need_w2 = ctx.needs_input_grad[:4]

    def tail(dx_rows, d_score_partial):
        d_logits = functional.router_backward(d_score_partial, rev_idx, scores, experts, logits,
                                              router_weight.shape[0], ctx.routing)
        return functional.combine_dx(dx_rows, rev_idx), d_logits.t() @ x

    dw1, dw2, (dx, d_router) = functional._routed_backward((need_x, need_w1, need_w2, True), grad_out, x, w1, w2,
                                                           scores, h, offsets, gather_idx, rev_idx, tail)
    return dx, d_router, dw1, dw2, None, None, None, None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--trace", action="store_true", help="print one backward's kernels per variant")
    ap.add_argument("configs", nargs="*", default=["olmoe-1b-7b", "paper-30b-n512"])
    args = ap.parse_args()
    _, _, configs = bench.load_anchors()
    # (backward, _ROUTER_DX_IN_K6) per variant
    variants = {"base": (BASE_BACKWARD, False), "no_router": (backward_without_router_dx, False),
                "in_k6": (BASE_BACKWARD, True)}
    bench.warm_up_gpu(1.0)
    _, timer = bench.anchor_protocol_timer()
    for name in args.configs:
        cfg = configs[name]
        T, d, n, E, K = cfg["T"], cfg["d"], cfg["n"], cfg["E"], cfg["K"]
        x, router, w1, w2 = params = bench.layer_params(T, d, n, E, data="anchor")
        for p in params:
            p.requires_grad_(True)
        grad = torch.randn(T, d, device="cuda").bfloat16()

        def clear_grads():
            for p in params:
                p.grad = None

        def forward():
            return sonicmoe.moe(x, router, w1, w2, K)

        def step():
            forward().backward(grad)
            clear_grads()

        def apply(v):
            backward, functional._ROUTER_DX_IN_K6 = variants[v]
            functional._MoELayer.backward = staticmethod(backward)

        if args.trace:
            for v in variants:
                apply(v)
                bench.print_backward_kernels(f"{name} {v}", step, forward, grad, clear_grads)

        bench.backward_variants_in_turn(name, variants, apply, forward, step,
                                        12.0 * T * K * d * n, args.rounds, timer, "base")
        functional._MoELayer.backward = staticmethod(BASE_BACKWARD)
        functional._ROUTER_DX_IN_K6 = DEFAULT_IN_K6
        del x, router, w1, w2, params, grad
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
