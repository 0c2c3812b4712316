"""Kernel lists of one inference forward with token rounding and with top-K, side by side (torch
profiler, after warm-up), at sweep 1's points of docs/design.md §6 (T 16384, d 1536, n 256, K 8): where
rounding's forward gains on the expert GEMMs and where its routing and layout cost more.

    python benchmarks/profile_token_rounding.py [--step] [E ...]   # default: 512 (the sparsest point)

--step: the kernels of a training step (forward and backward, gradients unset first) instead.
"""
import sys

import torch
sys.path.insert(0, "python")  # run from the repository root
sys.path.insert(0, "benchmarks")
import sonicmoe
from bench import TOKEN_ROUNDING_SWEEPS, cuda_events, layer_params

SWEEP_1 = TOKEN_ROUNDING_SWEEPS["T16384-d1536-n256-K8"][0]
T, d, n, K, TILE = SWEEP_1["T"], SWEEP_1["d"], SWEEP_1["n"], SWEEP_1["K"], 128


def kernel_list(fn):
    """(name, µs) of every kernel or copy one call of fn runs, in launch order."""
    for _ in range(3):
        fn()
    events = cuda_events(fn)
    return [(e.name, e.device_time) for e in events]


STEP = "--step" in sys.argv
for E in [int(a) for a in sys.argv[1:] if a != "--step"] or [512]:
    x, router, w1, w2 = layer_params(T, d, n, E)
    with torch.no_grad():
        experts = sonicmoe.router_topk(torch.nn.functional.linear(x, router), K, "topk_softmax")[1]
        counts = torch.bincount(experts.flatten(), minlength=E)
        tiles_topk = int(((counts + TILE - 1) // TILE).sum())
    for routing in ("topk_softmax", "token_rounding"):
        def forward():
            with torch.no_grad():
                return sonicmoe.moe(x, router, w1, w2, K, routing=routing, tile=TILE)

        def step():
            for p in (x, router, w1, w2):
                p.grad = None
            sonicmoe.moe(x, router, w1, w2, K, routing=routing, tile=TILE).backward(grad_out)
        grad_out = torch.randn_like(x)
        kernels = kernel_list(step if STEP else forward)
        total = sum(t for _, t in kernels)
        extra = f", {tiles_topk} m tiles of {TILE} (rounding: ~{T * K // TILE})" if routing == "topk_softmax" else ""
        print(f"== E {E} {routing}{' step' if STEP else ''}: {len(kernels)} kernels/copies, {total:.1f} us{extra}")
        for name, t in kernels:
            print(f"  {t:9.1f} us  {name[:110]}")
    del x, router, w1, w2
    torch.cuda.empty_cache()
