"""torch.ops.sonicmoe.combine (K3): validation on the CPU, numerics and determinism on the GPU."""

import re
import zlib

import pytest
import torch

import sonicmoe
from conftest import requires_extension, requires_kernel_gpu
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

# (T, E, K, d) of the GPU tests of K3 and K8: single token and expert, K up to 32, d up to 7168 and
# one d that is a multiple of 8 but not of 16.
# top_k 12 and 13: the last on 4 stages of cp.async slots and the first on 2 (combine.cu).
GPU_SHAPES = [(1, 1, 1, 8), (7, 8, 2, 64), (1000, 128, 8, 1536), (333, 64, 8, 2048), (257, 256, 16, 7168),
              (100, 40, 32, 256), (64, 16, 3, 2056), (200, 64, 12, 520), (150, 64, 13, 776)]

@requires_kernel_gpu
@pytest.mark.parametrize("T,E,K,d", GPU_SHAPES)
def test_combine_matches_reference(T, E, K, d):
    y, scores, rev_idx = make_inputs(T, E, K, d, "cuda", generator("cuda", T, E, K, d))
    torch.full((T * d,), float("nan"), device="cuda", dtype=torch.bfloat16)  # poison the pool
    out = sonicmoe.combine(y, scores, rev_idx)
    ref = reference(y, scores, rev_idx)
    assert out.shape == (T, d) and out.dtype == torch.bfloat16
    assert torch.isfinite(out).all()
    assert float((out.double() - ref).norm() / ref.norm()) <= 1e-2


@requires_kernel_gpu
def test_combine_is_deterministic():
    y, scores, rev_idx = make_inputs(4096, 64, 8, 1024, "cuda", generator("cuda", "det"))
    first = sonicmoe.combine(y, scores, rev_idx)
    for _ in range(3):
        assert torch.equal(sonicmoe.combine(y, scores, rev_idx), first)


@requires_kernel_gpu
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


# ---------------------------------------------------------------- combine_csr (token rounding)

@requires_extension
@pytest.mark.parametrize("args,exc,message", [
    ((torch.zeros(4, 8).bfloat16(), torch.zeros(3, dtype=torch.float64), torch.zeros(3, dtype=torch.int32),
      torch.zeros(2, dtype=torch.int32)), TypeError, "combine_csr: row_scores.dtype = Double breaks the rule"),
    ((torch.zeros(4, 8).bfloat16(), torch.zeros(3), torch.zeros(2, dtype=torch.int32),
      torch.zeros(2, dtype=torch.int32)), ValueError, "combine_csr: rows.shape = [2] breaks the rule: must equal"),
    ((torch.zeros(4, 6).bfloat16(), torch.zeros(3), torch.zeros(3, dtype=torch.int32),
      torch.zeros(2, dtype=torch.int32)), ValueError, "combine: d = 6 breaks the rule"),
    ((torch.zeros(4, 8).bfloat16(), torch.zeros(3), torch.zeros(3, dtype=torch.int32),
      torch.zeros(2, dtype=torch.int32)), ValueError, "combine_csr: y.device = cpu breaks the rule"),
])
def test_combine_csr_rejects(args, exc, message):
    with pytest.raises(exc, match=re.escape(message)):
        torch.ops.sonicmoe.combine_csr(*args)


@requires_kernel_gpu
@pytest.mark.parametrize("T,rows,max_per_token,d", [(0, 5, 3, 64), (1, 10, 40, 128), (1000, 5000, 12, 1536),
                                                    (333, 2000, 70, 264)])
def test_combine_csr_matches_torch(T, rows, max_per_token, d):
    gen = torch.Generator(device="cuda").manual_seed(T + d)
    y = torch.randn(rows, d, device="cuda", generator=gen).bfloat16()
    per_token = torch.randint(0, max_per_token + 1, (T,), device="cuda", generator=gen)
    offsets = torch.zeros(T + 1, dtype=torch.int32, device="cuda")
    offsets[1:] = per_token.cumsum(0)
    entries = int(offsets[-1])
    slack = 7  # entries past token_offsets[T] are never read
    idx = torch.randint(0, rows, (entries + slack,), device="cuda", generator=gen, dtype=torch.int32)
    scores = torch.rand(entries + slack, device="cuda", generator=gen)
    out = sonicmoe.combine_csr(y, scores, idx, offsets)
    token = torch.repeat_interleave(torch.arange(T, device="cuda"), per_token)
    ref = torch.zeros(T, d, device="cuda").index_add_(0, token, scores[:entries, None] * y[idx[:entries].long()].float())
    assert out.shape == (T, d)
    if T:
        assert ((out.float() - ref).norm() / ref.norm().clamp_min(1e-30)) <= 1e-2


# ---------------------------------------------------------------- combine_dx (K8)

def dx_inputs(T, E, K, d, device, gen, addend=True):
    """K6's rows, rev_idx and the router's part of dx (T, d), bf16 (None without addend)."""
    experts = torch.rand(T, E, generator=gen, device=device).argsort(dim=-1)[:, :K]
    rev_idx = routing_metadata(experts, E).rev_idx
    dx_rows = torch.randn(T * K, d, generator=gen, device=device).bfloat16()
    part = torch.randn(T, d, generator=gen, device=device).bfloat16() if addend else None
    return dx_rows, rev_idx, part


def dx_reference(dx_rows, rev_idx, addend):
    ref = dx_rows.double()[rev_idx.long()].sum(1)
    return ref if addend is None else ref + addend.double()


def valid_dx_cpu():
    return dx_inputs(6, 4, 2, 64, "cpu", generator("cpu", "valid_dx"))


DX_CASES = [
    ("dx_rows dtype", lambda r, i, a: (r.float(), i, a), TypeError,
     "combine_dx: dx_rows.dtype = Float breaks the rule: must be BFloat16"),
    ("rev_idx dtype", lambda r, i, a: (r, i.long(), a), TypeError,
     "combine_dx: rev_idx.dtype = Long breaks the rule: must be Int"),
    ("addend dtype", lambda r, i, a: (r, i, a.float()), TypeError,
     "combine_dx: addend.dtype = Float breaks the rule: must be BFloat16"),
    ("addend shape", lambda r, i, a: (r, i, a[:5]), ValueError,
     "combine_dx: addend.shape = [5, 64] breaks the rule: must be (T, d) = (6, 64)"),
    ("addend contiguity", lambda r, i, a: (r, i, a.t().contiguous().t()), ValueError,
     "combine_dx: addend.stride() = [1, 6] breaks the rule: must be contiguous"),
    ("d multiple of 8", lambda r, i, a: (r[:, :60].contiguous(), i, None), ValueError,
     "combine_dx: d = 60 breaks the rule: must be a positive multiple of 8"),
    ("top_k range", lambda r, i, a: (r, i[:, :0], a), ValueError,
     "combine_dx: top_k = 0 breaks the rule: must be in [1, 32]"),
    ("rev_idx dim", lambda r, i, a: (r, i[0], a), ValueError,
     "combine_dx: rev_idx.shape = [2] breaks the rule: must be 2-D (T, K)"),
    ("device", lambda r, i, a: (r, i, a), ValueError,
     "combine_dx: dx_rows.device = cpu breaks the rule: must be a CUDA device"),
]


@requires_extension
@pytest.mark.parametrize("name,mutate,exc,message", DX_CASES, ids=[c[0] for c in DX_CASES])
def test_combine_dx_rejects(name, mutate, exc, message):
    with pytest.raises(exc, match=re.escape(message)):
        torch.ops.sonicmoe.combine_dx(*mutate(*valid_dx_cpu()))


@requires_kernel_gpu
@pytest.mark.parametrize("addend", [True, False], ids=["addend", "rows_only"])
@pytest.mark.parametrize("T,E,K,d", GPU_SHAPES)
def test_combine_dx_matches_reference(T, E, K, d, addend):
    inputs = dx_inputs(T, E, K, d, "cuda", generator("cuda", "dx", T, E, K, d), addend)
    torch.full((T * d,), float("nan"), device="cuda", dtype=torch.bfloat16)  # poison the pool
    out = sonicmoe.combine_dx(*inputs)
    ref = dx_reference(*inputs)
    assert out.shape == (T, d) and out.dtype == torch.bfloat16
    assert torch.isfinite(out).all()
    # One bf16 rounding of an fp32 sum: within 2^-8 of each value.
    assert bool(((out.double() - ref).abs() <= 2 ** -8 * ref.abs() + 1e-6).all())


@requires_kernel_gpu
def test_combine_dx_is_deterministic_and_unit_weighted():
    dx_rows, rev_idx, part = dx_inputs(4096, 64, 8, 1024, "cuda", generator("cuda", "dx_det"))
    first = sonicmoe.combine_dx(dx_rows, rev_idx, part)
    for _ in range(3):
        assert torch.equal(sonicmoe.combine_dx(dx_rows, rev_idx, part), first)
    # Without the addend it is K3 with every score 1, bit for bit (the same sum order).
    ones = torch.ones(rev_idx.shape, device="cuda")
    assert torch.equal(sonicmoe.combine_dx(dx_rows, rev_idx), sonicmoe.combine(dx_rows, ones, rev_idx))


@requires_kernel_gpu
def test_combine_dx_empty_and_opcheck_and_graph():
    dx_rows, rev_idx, part = dx_inputs(50, 8, 2, 128, "cuda", generator("cuda", "dx_misc"))
    assert sonicmoe.combine_dx(dx_rows[:0], rev_idx[:0], part[:0]).shape == (0, 128)
    torch.library.opcheck(torch.ops.sonicmoe.combine_dx, (dx_rows, rev_idx, part))
    torch.library.opcheck(torch.ops.sonicmoe.combine_dx, (dx_rows, rev_idx))
    sonicmoe.combine_dx(dx_rows, rev_idx, part)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = torch.ops.sonicmoe.combine_dx(dx_rows, rev_idx, part)
    part.copy_(torch.randn_like(part, dtype=torch.float32).bfloat16())
    graph.replay()
    torch.cuda.synchronize()
    ref = dx_reference(dx_rows, rev_idx, part)
    assert bool(((out.double() - ref).abs() <= 2 ** -8 * ref.abs() + 1e-6).all())


# ------------------------------------------------------------------ scatter_rows

def scatter_inputs(T, E, K, d, device, gen):
    experts = torch.rand(T, E, generator=gen, device=device).argsort(dim=-1)[:, :K]
    meta = routing_metadata(experts, E)
    x = torch.randn(T, d, generator=gen, device=device).bfloat16()
    return x, meta.rev_idx, meta.gather_idx


SCATTER_CASES = [
    ("x dtype", lambda x, r: (x.float(), r), TypeError,
     "scatter_rows: x.dtype = Float breaks the rule: must be BFloat16"),
    ("rev_idx dtype", lambda x, r: (x, r.long()), TypeError,
     "scatter_rows: rev_idx.dtype = Long breaks the rule: must be Int"),
    ("rev_idx rows", lambda x, r: (x, r[:5]), ValueError,
     "scatter_rows: rev_idx.shape = [5, 2] breaks the rule: must have x.shape[0] = 6 rows"),
    ("d multiple of 8", lambda x, r: (x[:, :60].contiguous(), r), ValueError,
     "scatter_rows: d = 60 breaks the rule: must be a positive multiple of 8"),
    ("top_k range", lambda x, r: (x, r[:, :0]), ValueError,
     "scatter_rows: top_k = 0 breaks the rule: must be in [1, 32]"),
    ("x contiguity", lambda x, r: (x.t().contiguous().t(), r), ValueError,
     "scatter_rows: x.stride() = [1, 6] breaks the rule: must be contiguous"),
    ("device", lambda x, r: (x, r), ValueError,
     "scatter_rows: x.device = cpu breaks the rule: must be a CUDA device"),
]


@requires_extension
@pytest.mark.parametrize("name,mutate,exc,message", SCATTER_CASES, ids=[c[0] for c in SCATTER_CASES])
def test_scatter_rows_rejects(name, mutate, exc, message):
    x, rev_idx, _ = scatter_inputs(6, 4, 2, 64, "cpu", generator("cpu", "scatter_valid"))
    with pytest.raises(exc, match=re.escape(message)):
        torch.ops.sonicmoe.scatter_rows(*mutate(x, rev_idx))


@requires_kernel_gpu
@pytest.mark.parametrize("T,E,K,d", [(1, 4, 1, 8), (37, 6, 3, 24), (1000, 64, 8, 4096), (513, 60, 4, 2056),
                                     (300, 32, 32, 136)])
def test_scatter_rows_equals_the_gather(T, E, K, d):
    # Every row of the result written once: bit for bit x[gather_idx] on NaN-poisoned memory.
    x, rev_idx, gather_idx = scatter_inputs(T, E, K, d, "cuda", generator("cuda", "scatter", T, E, K, d))
    torch.full((T * K * d,), float("nan"), device="cuda", dtype=torch.bfloat16)  # poison the pool
    out = sonicmoe.scatter_rows(x, rev_idx)
    assert out.shape == (T * K, d) and out.dtype == torch.bfloat16
    assert torch.equal(out, x[gather_idx.long()])


@requires_kernel_gpu
def test_scatter_rows_empty_and_opcheck_and_graph():
    x, rev_idx, gather_idx = scatter_inputs(50, 8, 2, 128, "cuda", generator("cuda", "scatter_misc"))
    assert sonicmoe.scatter_rows(x[:0], rev_idx[:0]).shape == (0, 128)
    torch.library.opcheck(torch.ops.sonicmoe.scatter_rows, (x, rev_idx))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = torch.ops.sonicmoe.scatter_rows(x, rev_idx)
    x.copy_(torch.randn_like(x, dtype=torch.float32).bfloat16())
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, x[gather_idx.long()])
