"""Is combine_csr's gap to combine the tokens with more than K entries? (session 18's question)

At T 16384, d 1536, combine_csr takes ~125 µs on token rounding's layout at E 64 (~131 at E 512)
where combine takes ~117 on top-K's (docs/perf-notes.md, session 18). Times, interleaved, on the
same y and the same set of rows:

  combine        top-K's rev_idx, exactly K per token
  csr K          the same pairs as CSR (token_offsets = K t): the kernel's own cost
  csr moved p    the same pairs with the K-th entry of a share p of the tokens moved to another
                 token (so p of them hold K + 1 entries, p hold K - 1): the second round of loads
  csr rounded    token rounding's own layout at E (its y rows are the rounded pairs)

    python experiments/combine_csr_entries.py [E ...]     # default: 64 512
"""
import sys

import torch

sys.path.insert(0, "python")  # run from the repository root
sys.path.insert(0, "benchmarks")
import sonicmoe
from bench import time_interleaved
from sonicmoe.routing import dense_routing_metadata_expert_major, dense_row_bound, token_rounding_expert_major

T, d, K = 16384, 1536, 8
SHARES = (0.063, 0.253)  # tokens with more than 8 entries at E 64 and E 512 (session 18, CPU count)


def csr_of_pairs(token, row, score):
    """(row_scores, rows, token_offsets), combine_csr's arguments after y, of (token, row, score)
    pairs in token order (stable)."""
    order = torch.sort(token, stable=True).indices
    counts = torch.bincount(token, minlength=T)
    offsets = torch.zeros(T + 1, dtype=torch.int32, device=token.device)
    offsets[1:] = counts.cumsum(0)
    return score[order].contiguous(), row[order].int().contiguous(), offsets


def main():
    gen = torch.Generator(device="cuda").manual_seed(0)
    for E in [int(a) for a in sys.argv[1:]] or [64, 512]:
        experts = torch.rand(T, E, device="cuda", generator=gen).argsort(dim=-1)[:, :K]
        rev_idx = sonicmoe.routing_metadata(experts, E).rev_idx
        scores = torch.rand(T, K, device="cuda", generator=gen).softmax(-1)
        y = torch.randn(T * K, d, device="cuda", generator=gen).bfloat16()
        token = torch.arange(T, device="cuda").repeat_interleave(K)
        fns = {"combine": lambda: sonicmoe.combine(y, scores, rev_idx)}
        exact = csr_of_pairs(token, rev_idx.flatten(), scores.flatten())
        fns["csr K"] = lambda: sonicmoe.combine_csr(y, *exact)
        for p in SHARES:
            moved = int(p * T)
            perm = torch.randperm(T, device="cuda", generator=gen)
            donors, receivers = perm[:moved], perm[moved:2 * moved]
            t = token.clone()
            t[donors * K + K - 1] = receivers  # the donor's K-th pair now belongs to the receiver
            csr = csr_of_pairs(t, rev_idx.flatten(), scores.flatten())
            fns[f"csr moved {p}"] = (lambda csr: lambda: sonicmoe.combine_csr(y, *csr))(csr)
        router = torch.randn(E, d, device="cuda", generator=gen).bfloat16() * d**-0.5
        x = torch.randn(T, d, device="cuda", generator=gen).bfloat16()
        with torch.no_grad():
            _, probs_t, assigned_t = token_rounding_expert_major(torch.nn.functional.linear(x, router), K, 128,
                                                                 fp32_probs=True)
            meta = dense_routing_metadata_expert_major(probs_t, assigned_t, dense_row_bound(T, E, K, 128))
        y_rounded = torch.randn(meta.gather_idx.shape[0], d, device="cuda", generator=gen).bfloat16()
        fns["csr rounded"] = lambda: sonicmoe.combine_csr(y_rounded, meta.row_scores, meta.rows, meta.token_offsets)
        ms = time_interleaved(fns, rounds=5, iters=20)
        print(f"E {E}: " + ", ".join(f"{name} {ms[name] * 1e3:.1f} µs" for name in fns))


if __name__ == "__main__":
    main()
