"""K8's timeline beside K5 / K7, warp by warp, on a build with experiments/k8_timeline.diff (a
diagnostic, never the product: K8's warps write their start and end (global timer, ns) and their
SM over the first 24 bytes of their token's row of dx): how many SMs K8 has over time and what each
one reads. Session 40: beside K5 / K7, exactly the SMs they leave, at 29-39 GB/s each (the whole
GPU's copy rate spread over 132), the rest of its bytes after them on all SMs.

For each config and variant (K8 after K5 / K7, or beside them with a margin of N SMs), one layer
step after warm-up, then from the stamps:

  span      first K8 warp's start to the last one's end (µs)
  phases    the bins (--bin µs) with at most --few SMs running K8 warps (beside K5 / K7) and the
            rest (after them): µs, mean SMs, TB/s and GB/s an SM (a token's bytes, top_k rows and
            the router's part read and dx written, spread evenly over its warp's interval)
  timeline  every --every-th bin: start µs, SMs, TB/s

    python3 experiments/k8_timeline.py [--margins 4,8] [--bin 50] [CONFIG ...]   # on the H200, linked build
"""
import argparse
import sys

import numpy as np
import torch

sys.path.insert(0, "python")
sys.path.insert(0, "benchmarks")
import bench  # noqa: E402
import sonicmoe  # noqa: E402
from sonicmoe import functional  # noqa: E402
from tail_hidden import RULE, variant  # noqa: E402  (margin None: K8 after K5 / K7, else beside them)


def stamps(dx):
    """(start ns, end ns, SM) per token from dx's rows (int64 numpy arrays)."""
    words = dx.view(torch.int64)[:, :3].cpu().numpy()
    return words[:, 0], words[:, 1], words[:, 2] & 0xFFFFFFFF


def bins_of(start, end, sm, token_bytes, bin_ns):
    """Per bin: the SMs running K8 warps and the bytes moved (each token's spread over its warp)."""
    t0 = start.min()
    n_bins = int((end.max() - t0) // bin_ns) + 1
    sms = [set() for _ in range(n_bins)]
    moved = np.zeros(n_bins)
    for s, e, m in zip(start - t0, end - t0, sm):
        first, last = int(s // bin_ns), int(max(e - 1, s) // bin_ns)
        rate = token_bytes / max(e - s, 1)
        for b in range(first, last + 1):
            sms[b].add(int(m))
            moved[b] += rate * (min(e, (b + 1) * bin_ns) - max(s, b * bin_ns))
    return np.array([len(x) for x in sms]), moved


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--margins", default="4,8", help="SMs K5 / K7 leave to K8, one variant each")
    ap.add_argument("--bin", type=float, default=50.0, help="bin width, µs")
    ap.add_argument("--few", type=int, default=24, help="a bin with at most this many SMs is 'beside'")
    ap.add_argument("--every", type=int, default=10, help="print every N-th bin of the timeline")
    ap.add_argument("configs", nargs="*", default=["olmoe-1b-7b", "paper-30b-n512"])
    args = ap.parse_args()
    _, _, configs = bench.load_anchors()
    variants = {"after": None, **{f"beside_m{m}": int(m) for m in args.margins.split(",") if m}}
    bin_ns = args.bin * 1e3
    for name in args.configs:
        cfg = configs[name]
        T, d, n, E, K = cfg["T"], cfg["d"], cfg["n"], cfg["E"], cfg["K"]
        x, router, w1, w2 = params = bench.layer_params(T, d, n, E, data="anchor")
        grad = torch.randn(T, d, device="cuda").bfloat16()
        token_bytes = (K + 2) * d * 2
        for v, margin in variants.items():
            variant(margin)
            for _ in range(4):
                sonicmoe.moe(x, router, w1, w2, K).backward(grad)
                for p in params:
                    p.grad = None
            sonicmoe.moe(x, router, w1, w2, K).backward(grad)
            torch.cuda.synchronize()
            start, end, sm = stamps(x.grad)
            for p in params:
                p.grad = None
            active, moved = bins_of(start, end, sm, token_bytes, bin_ns)
            span = (end.max() - start.min()) / 1e3
            print(f"{name} {v}: K8 span {span:.0f} µs, {len(set(sm.tolist()))} SMs in all, "
                  f"{T * token_bytes / span / 1e6:.2f} TB/s over the span", flush=True)
            for phase, mask in (("beside", active <= args.few), ("after", active > args.few)):
                if mask.any():
                    us = mask.sum() * args.bin
                    tbs = moved[mask].sum() / (us * 1e6)
                    print(f"  {phase}: {us:.0f} µs, {active[mask].mean():.1f} SMs, {tbs:.3f} TB/s, "
                          f"{tbs * 1e3 / active[mask].mean():.1f} GB/s an SM", flush=True)
            print("  timeline (µs, SMs, TB/s): " + "  ".join(
                f"{b * args.bin:.0f}:{active[b]}:{moved[b] / bin_ns / 1e3:.2f}"
                for b in range(0, len(active), args.every)), flush=True)
        functional._TAIL_SM_MARGIN, functional._TAIL_BESIDE_MIN_N, functional._TAIL_BESIDE_MAX_N = RULE
        del x, router, w1, w2, params, grad
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
