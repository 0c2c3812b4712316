"""CPU emulation of experiments/assign_bin_list.diff's selection (numpy), checked against
sonicmoe.routing._assign_by_sort on random rows, heavy ties and all three rules: the flips above
the first-digit bin, the later digits within it, and the ties by token order. It checks the
algorithm, not the CUDA code (the GPU tests do that).

    python experiments/assign_bin_list_emulation.py
"""
import sys

import numpy as np
import torch

sys.path.insert(0, "python")  # run from the repository root
from sonicmoe.routing import _assign_by_sort, _rounded_counts

SH = [19, 8, 0]  # each digit's shift and mask, as radix_shift / radix_mask
MK = [0xfff, 0x7ff, 0xff]

def take_digit(keys, pas, prefix, pmask, remaining):
    d = ((keys >> SH[pas]) & MK[pas]).astype(np.int64)
    bins = np.bincount(d, minlength=4096)
    above = 0
    for digit in range(4095, -1, -1):
        if above + bins[digit] >= remaining:
            break
        above += bins[digit]
    return prefix | (digit << SH[pas]), pmask | (MK[pas] << SH[pas]), remaining - above

def assign_row(p, chosen, tile, rule):
    """One expert's row: its assignment after rounding, and its target count."""
    T = len(p); out = chosen.copy()
    count = int(chosen.sum())
    target = int(_rounded_counts(torch.tensor(count), T, tile, rule))
    need = target - count
    if need == 0: return out, target
    adding = need > 0; remaining = abs(need)
    bits = p.astype(np.float32).view(np.uint32)
    key = bits if adding else (~bits & 0xffffffff).astype(np.uint32)
    cand = ~chosen if adding else chosen
    prefix = (0 if adding else 0xffffffff) & 0x80000000; pmask = 0x80000000
    prefix, pmask, remaining = take_digit(key[cand], 0, prefix, pmask, remaining)
    bprefix, bmask = prefix, pmask
    inbin = cand & ((key & bmask) == bprefix)
    out ^= cand & ((key & bmask) > bprefix)
    pool = inbin  # the list (or, past its capacity, the row's passes) filters these candidates
    for pas in (1, 2):
        m = pool & ((key & pmask) == prefix)
        prefix, pmask, remaining = take_digit(key[m], pas, prefix, pmask, remaining)
    thr = prefix
    out ^= inbin & (key > thr)
    ties = np.nonzero(inbin & (key == thr))[0]
    assert len(ties) >= remaining >= 1
    order = ties if adding else ties[::-1]
    out[order[:remaining]] ^= True
    return out, target

rng = np.random.default_rng(0)
def check(T, E, K, tile, rule, quant=None):
    logits = torch.from_numpy(rng.standard_normal((T, E)).astype(np.float32))
    if quant: logits = (logits * quant).round() / quant
    probs = logits.softmax(-1)
    chosen = torch.zeros(T, E, dtype=torch.bool); chosen.scatter_(1, logits.topk(K, -1).indices, True)
    counts = chosen.sum(0)
    target = _rounded_counts(counts, T, tile, rule)
    ref = _assign_by_sort(probs, chosen, target)  # (T, E)
    pn, cn = probs.numpy(), chosen.numpy()
    for e in range(E):
        got, _ = assign_row(pn[:, e].copy(), cn[:, e].copy(), tile, rule)
        assert (got == ref[:, e].numpy()).all(), (T, E, K, tile, rule, quant, e)
    return True

n = 0
for T, E, K in [(1000, 8, 2), (4099, 16, 4), (16384, 64, 8), (3000, 128, 8), (513, 4, 1)]:
    for tile in (16, 128):
        for rule in ("nearest", "up", "down"):
            for quant in (None, 4, 1):   # quant: heavy ties
                check(T, E, K, tile, rule, quant); n += 1
print("ok", n)
