"""In-process A/B of token rounding's router: the fused rounding_probs kernel (the tree) against
the path before it (session 16): the logits' fp32 copy, torch's softmax, R's top-K, the choice
scattered into a zeroed (E, T) bool and the probabilities' transpose. Times the inference forward
(under no_grad) and the training step (forward + backward) of sonicmoe.moe with
routing="token_rounding", beside top-K's forward, interleaved, at the two sweeps of DESIGN §6.

    python experiments/ab_rounding_probs.py [--rounds 7]
"""
import argparse
import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import sonicmoe  # noqa: E402
import sonicmoe.functional as F  # noqa: E402
from sonicmoe._ops import router_topk, token_rounding_assign  # noqa: E402
from sonicmoe.routing import TOKEN_ROUNDING_RULES  # noqa: E402
from bench import TOKEN_ROUNDING_SWEEPS, layer_params, time_interleaved, warm_up_gpu  # noqa: E402


def unfused_expert_major(logits, top_k, tile=128, rule="nearest", *, fp32_probs=False):
    """token_rounding_expert_major's kernel path before rounding_probs (the layer passed fp32)."""
    logits = logits.float()
    T, E = logits.shape
    probs = logits.softmax(dim=-1)
    top = router_topk(logits.detach(), top_k, "topk_softmax")[1].long()
    chosen_t = torch.zeros(E, T, dtype=torch.bool, device=logits.device).scatter_(0, top.t(), True)
    probs_t = probs.detach().float().t().contiguous()
    assigned_t, _ = token_rounding_assign(probs_t, chosen_t, tile, TOKEN_ROUNDING_RULES.index(rule))
    return probs, probs_t, assigned_t


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    warm_up_gpu()
    fused = F.token_rounding_expert_major
    print(f"{'sweep point':<28}{'topk fwd':>9}{'TR fwd':>8}{'unfused':>8}{'gain':>7}{'vs topk':>8}"
          f"{'TR f+b':>8}{'unfused':>8}{'gain':>7}  (ms; gain = unfused / fused)")
    for sweep, points in TOKEN_ROUNDING_SWEEPS.items():
        for cfg in points:
            T, d, n, E, K = cfg["T"], cfg["d"], cfg["n"], cfg["E"], cfg["K"]
            x, router, w1, w2 = layer_params(T, d, n, E)
            router.requires_grad_(True)
            grad = torch.randn(T, d, device="cuda").bfloat16()

            def with_router(impl, train):
                def run():
                    F.token_rounding_expert_major = impl
                    try:
                        if train:
                            sonicmoe.moe(x, router, w1, w2, K, routing="token_rounding").backward(grad)
                        else:
                            with torch.no_grad():
                                sonicmoe.moe(x, router, w1, w2, K, routing="token_rounding")
                    finally:
                        F.token_rounding_expert_major = fused
                return run

            def topk_fwd():
                with torch.no_grad():
                    sonicmoe.moe(x, router, w1, w2, K)

            # Both routers decide alike (same probabilities up to ulps, same top-K).
            with torch.no_grad():
                logits = torch.nn.functional.linear(x, router)
                a = fused(logits, K, 128, fp32_probs=True)[2]
                b = unfused_expert_major(logits, K, 128)[2]
            same = bool(torch.equal(a, b))
            ms = time_interleaved({"topk": topk_fwd, "fused": with_router(fused, False),
                                   "unfused": with_router(unfused_expert_major, False),
                                   "fused_fb": with_router(fused, True),
                                   "unfused_fb": with_router(unfused_expert_major, True)},
                                  rounds=args.rounds, iters=10)
            router.grad = None
            print(f"{sweep[:18] + ' E' + str(E):<28}{ms['topk']:>9.3f}{ms['fused']:>8.3f}{ms['unfused']:>8.3f}"
                  f"{ms['unfused'] / ms['fused']:>7.3f}{ms['topk'] / ms['fused']:>8.3f}{ms['fused_fb']:>8.3f}"
                  f"{ms['unfused_fb']:>8.3f}{ms['unfused_fb'] / ms['fused_fb']:>7.3f}"
                  f"{'' if same else '  (assignments differ)'}", flush=True)
            del x, router, w1, w2, grad
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
