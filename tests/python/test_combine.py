"""torch.ops.sonicmoe.combine (K3): validation on the CPU, numerics and determinism on the GPU."""

import re
import zlib

import pytest
import torch

import sonicmoe
from conftest import requires_extension, requires_hopper
from sonicmoe.routing import routing_metadata


def generator(device, *key):
    return torch.Generator(device=device).manual_seed(zlib.crc32(repr(key).encode()))


def make_inputs(T, E, K, d, device, gen):
    experts = torch.rand(T, E, generator=gen, device=device).argsort(dim=-1)[:, :K]
    meta = routing_metadata(experts, E)
    y = torch.randn(T * K, d, generator=gen, device=device).bfloat16()
    scores = torch.rand(T, K, generator=gen, device=device).softmax(-1)
    return y, scores, meta.rev_idx


def reference(y, scores, rev_idx):
    return (scores.double()[..., None] * y.double()[rev_idx.long()]).sum(1)


# ------------------------------------------------------------------ validation (CPU)

def valid_cpu():
    return make_inputs(6, 4, 2, 64, "cpu", generator("cpu", "valid"))


CASES = [
    ("y dtype", lambda y, s, r: (y.float(), s, r), TypeError,
     "combine: y.dtype = Float breaks the rule: must be BFloat16"),
    ("scores dtype", lambda y, s, r: (y, s.double(), r), TypeError,
     "combine: scores.dtype = Double breaks the rule: must be Float"),
    ("rev_idx dtype", lambda y, s, r: (y, s, r.long()), TypeError,
     "combine: rev_idx.dtype = Long breaks the rule: must be Int"),
    ("y dim", lambda y, s, r: (y[None], s, r), ValueError,
     "combine: y.shape = [1, 12, 64] breaks the rule: must be 2-D (num_rows, d)"),
    ("rev_idx shape", lambda y, s, r: (y, s, r[:5]), ValueError,
     "combine: rev_idx.shape = [5, 2] breaks the rule: must equal scores.shape = [6, 2]"),
    ("d multiple of 8", lambda y, s, r: (y[:, :60].contiguous(), s, r), ValueError,
     "combine: d = 60 breaks the rule: must be a positive multiple of 8"),
    ("top_k range", lambda y, s, r: (y, s[:, :0], r[:, :0]), ValueError,
     "combine: top_k = 0 breaks the rule: must be in [1, 32]"),
    ("y contiguity", lambda y, s, r: (y.t().contiguous().t(), s, r), ValueError,
     "combine: y.stride() = [1, 12] breaks the rule: must be contiguous"),
    ("device", lambda y, s, r: (y, s, r), ValueError,
     "combine: y.device = cpu breaks the rule: must be a CUDA device"),
]


@requires_extension
@pytest.mark.parametrize("name,mutate,exc,message", CASES, ids=[c[0] for c in CASES])
def test_combine_rejects(name, mutate, exc, message):
    with pytest.raises(exc, match=re.escape(message)):
        torch.ops.sonicmoe.combine(*mutate(*valid_cpu()))


# ------------------------------------------------------------------ GPU

@requires_hopper
@pytest.mark.parametrize("T,E,K,d", [(1, 1, 1, 8), (7, 8, 2, 64), (1000, 128, 8, 1536),
                                     (333, 64, 8, 2048), (257, 256, 16, 7168), (100, 40, 32, 256),
                                     (64, 16, 3, 2056)])
def test_combine_matches_reference(T, E, K, d):
    y, scores, rev_idx = make_inputs(T, E, K, d, "cuda", generator("cuda", T, E, K, d))
    torch.full((T * d,), float("nan"), device="cuda", dtype=torch.bfloat16)  # poison the pool
    out = sonicmoe.combine(y, scores, rev_idx)
    ref = reference(y, scores, rev_idx)
    assert out.shape == (T, d) and out.dtype == torch.bfloat16
    assert torch.isfinite(out).all()
    assert float((out.double() - ref).norm() / ref.norm()) <= 1e-2


@requires_hopper
def test_combine_is_deterministic():
    y, scores, rev_idx = make_inputs(4096, 64, 8, 1024, "cuda", generator("cuda", "det"))
    first = sonicmoe.combine(y, scores, rev_idx)
    for _ in range(3):
        assert torch.equal(sonicmoe.combine(y, scores, rev_idx), first)


@requires_hopper
def test_combine_empty_and_opcheck_and_graph():
    y, scores, rev_idx = make_inputs(50, 8, 2, 128, "cuda", generator("cuda", "misc"))
    assert sonicmoe.combine(y[:0], scores[:0], rev_idx[:0]).shape == (0, 128)
    torch.library.opcheck(torch.ops.sonicmoe.combine, (y, scores, rev_idx))
    sonicmoe.combine(y, scores, rev_idx)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = torch.ops.sonicmoe.combine(y, scores, rev_idx)
    y.copy_(torch.randn_like(y, dtype=torch.float32).bfloat16())
    graph.replay()
    torch.cuda.synchronize()
    ref = reference(y, scores, rev_idx)
    assert float((out.double() - ref).norm() / ref.norm()) <= 1e-2
