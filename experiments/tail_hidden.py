"""The backward's memory-bound tail beside K5 / K7 on SMs they leave to it, against after them.

After K4 and K6 the top-K layer's backward runs K5 (dW2) and K7 (dW1), compute-bound, and its
tail: router_backward, the router's two cuBLAS GEMMs and K8 (combine_dx), memory-bound at the
copy rate (~0.45 ms at olmoe-1b-7b, ~0.8 ms at paper-30b-n512). The tail reads only K4's score
slots and K6's dX~, so sonicmoe.functional runs it on a second stream beside K5 / K7 (where
_TAIL_BESIDE_MIN_N <= n <= _TAIL_BESIDE_MAX_N), which leave it _TAIL_SM_MARGIN SMs (weight_grad's
sm_margin: their persistent grids take every SM otherwise) and run on a stream of higher priority.

Timed as the anchors' protocol (forward and forward + backward windows after idle; the backward
is their difference), the variants alternating in one process, at every n:
  sequential    the tail after K5 / K7 (the backward before session 38)
  beside_mN     the tail beside K5 / K7, which leave it N SMs (N = 0: it takes only what their
                last waves leave)

    python experiments/tail_hidden.py [--margins 0,4,8,16] [--rounds 3] [--check] [--trace] [CONFIG ...]
"""
import argparse
import sys

import torch

sys.path.insert(0, "python")
sys.path.insert(0, "benchmarks")
import bench  # noqa: E402
import sonicmoe  # noqa: E402
from sonicmoe import functional  # noqa: E402

RULE = (functional._TAIL_SM_MARGIN, functional._TAIL_BESIDE_MIN_N, functional._TAIL_BESIDE_MAX_N)


def variant(margin):
    """Sets the layer's rule: margin None runs the tail after K5 / K7 (the backward before
    session 38), else beside them on a second stream, K5 / K7 leaving it `margin` SMs (at every n)."""
    functional._TAIL_SM_MARGIN = margin or 0
    functional._TAIL_BESIDE_MIN_N = 0
    functional._TAIL_BESIDE_MAX_N = -1 if margin is None else 1 << 30


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--margins", default="0,4,8,16", help="SMs K5 / K7 leave to the tail, one variant each")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--check", action="store_true", help="compare the gradients with the sequential one's first")
    ap.add_argument("--trace", action="store_true", help="print one step's backward kernels per variant")
    ap.add_argument("configs", nargs="*", default=["olmoe-1b-7b", "paper-30b-n512"])
    args = ap.parse_args()
    _, _, configs = bench.load_anchors()
    variants = {"sequential": None, **{f"beside_m{m}": m for m in (int(v) for v in args.margins.split(",") if v)}}
    bench.warm_up_gpu(1.0)
    _, timer = bench.anchor_protocol_timer()
    for name in args.configs:
        cfg = configs[name]
        T, d, n, E, K = cfg["T"], cfg["d"], cfg["n"], cfg["E"], cfg["K"]
        x, router, w1, w2 = params = bench.layer_params(T, d, n, E, data="anchor")
        grad = torch.randn(T, d, device="cuda").bfloat16()

        def clear_grads():
            for p in params:
                p.grad = None

        def forward():
            return sonicmoe.moe(x, router, w1, w2, K)

        def step():
            forward().backward(grad)
            clear_grads()

        if args.check:
            grads = {}
            for v in variants:
                variant(variants[v])
                forward().backward(grad)
                grads[v] = [p.grad.float() for p in params]
                clear_grads()
            for v in variants:
                err = [float((a - b).abs().max()) for a, b in zip(grads[v], grads["sequential"])]
                print(f"  {name} {v}: max |grad - sequential's| x, router, w1, w2: " +
                      ", ".join(f"{e:.3g}" for e in err), flush=True)
            del grads

        if args.trace:
            for v in variants:
                variant(variants[v])
                bench.print_backward_kernels(f"{name} {v}", step, forward, grad, clear_grads)

        bwd_flops = 12.0 * T * K * d * n
        bench.backward_variants_in_turn(name, variants, lambda v: variant(variants[v]),
                                        forward, step, bwd_flops, args.rounds,
                                        timer, "sequential")
        functional._TAIL_SM_MARGIN, functional._TAIL_BESIDE_MIN_N, functional._TAIL_BESIDE_MAX_N = RULE
        del x, router, w1, w2, params, grad
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
