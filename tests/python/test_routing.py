"""sonicmoe.routing.routing_metadata: layout invariants on CPU and, when present, CUDA."""

import zlib

import pytest
import torch

from sonicmoe.routing import RoutingMetadata, routing_metadata

DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    ),
]


def make_gen(*key):
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def topk_experts(T, E, K, gen, dtype=torch.int64):
    """Distinct experts per token, as a top-K router produces."""
    return torch.rand(T, E, generator=gen).argsort(dim=-1)[:, :K].to(dtype)


def check_metadata(meta, experts, num_experts):
    """Every invariant of RoutingMetadata, checked on the host against a plain-Python sort."""
    assert isinstance(meta, RoutingMetadata)
    off, gather, rev = meta
    for t in meta:
        assert t.dtype == torch.int32
        assert t.device == experts.device
    T, K = experts.shape
    assert off.shape == (num_experts + 1,)
    assert gather.shape == (T * K,)
    assert rev.shape == (T, K)

    off, gather, rev = off.cpu(), gather.cpu(), rev.cpu()
    flat = experts.flatten().cpu().long()
    ids = flat.tolist()

    counts = torch.bincount(flat, minlength=num_experts)
    assert int(off[0]) == 0 and int(off[-1]) == T * K
    assert torch.equal(off.diff().long(), counts)

    # rev_idx is a permutation of the rows and gather_idx inverts it to the token.
    assert torch.equal(rev.flatten().sort().values.long(), torch.arange(T * K))
    tokens = torch.arange(T).unsqueeze(1).expand(T, K)
    assert torch.equal(gather[rev.long()].long(), tokens)

    # Row r holds pair f = order[r]; rows of expert e lie in [off[e], off[e+1]).
    order = torch.empty(T * K, dtype=torch.long)
    order[rev.flatten().long()] = torch.arange(T * K)
    sorted_ids = flat[order]
    assert bool((sorted_ids[1:] >= sorted_ids[:-1]).all())
    row_expert = torch.repeat_interleave(torch.arange(num_experts), counts)
    assert torch.equal(sorted_ids, row_expert)

    # Deterministic order: by expert, then (token, k) ascending.
    want = sorted(range(T * K), key=lambda f: (ids[f], f))
    assert order.tolist() == want
    assert gather.tolist() == [f // K for f in want]


RANDOM_CASES = [(1, 1, 1), (1, 37, 1)] + [
    (E, T, K) for E in (8, 128, 256) for T, K in ((1, 1), (37, 1), (64, 2), (301, 8))
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("E,T,K", RANDOM_CASES)
def test_random_topk(device, E, T, K):
    experts = topk_experts(T, E, K, make_gen(E, T, K)).to(device)
    check_metadata(routing_metadata(experts, E), experts, E)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_id_dtypes(device, dtype):
    experts = topk_experts(50, 16, 4, make_gen(dtype), dtype).to(device)
    check_metadata(routing_metadata(experts, 16), experts, 16)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("E", [1, 8, 256])
@pytest.mark.parametrize("K", [1, 4])
def test_no_tokens(device, E, K):
    experts = torch.empty(0, K, dtype=torch.int64, device=device)
    meta = routing_metadata(experts, E)
    check_metadata(meta, experts, E)
    assert bool((meta.expert_offsets == 0).all())


@pytest.mark.parametrize("device", DEVICES)
def test_empty_experts(device):
    # Only experts 0, 3 and 7 of 16 receive rows; the rest must have empty ranges.
    gen = make_gen("empty")
    experts = torch.tensor([0, 3, 7])[torch.randint(0, 3, (40, 2), generator=gen)]
    experts = experts.to(device)
    meta = routing_metadata(experts, 16)
    check_metadata(meta, experts, 16)
    counts = meta.expert_offsets.diff().cpu()
    assert counts.nonzero().flatten().tolist() == [0, 3, 7]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("E,hot", [(1, 0), (8, 5), (256, 255)])
def test_one_hot_expert(device, E, hot):
    experts = torch.full((23, 3), hot, dtype=torch.int64, device=device)
    meta = routing_metadata(experts, E)
    check_metadata(meta, experts, E)
    off = meta.expert_offsets.cpu()
    assert off[: hot + 1].tolist() == [0] * (hot + 1)
    assert off[hot + 1 :].tolist() == [69] * (E - hot)
    # All rows in one expert: identity order, token t owns rows [3t, 3t + 3).
    assert meta.rev_idx.flatten().cpu().tolist() == list(range(69))


@pytest.mark.parametrize("device", DEVICES)
def test_deterministic(device):
    experts = topk_experts(500, 64, 6, make_gen("det")).to(device)
    first = routing_metadata(experts, 64)
    for _ in range(3):
        again = routing_metadata(experts, 64)
        for a, b in zip(first, again):
            assert torch.equal(a, b)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graph_capture():
    # Capture fails on any host sync, so this proves there is none.
    T, E, K = 1024, 128, 8
    static = topk_experts(T, E, K, make_gen("graph", 0)).cuda()

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        routing_metadata(static, E)  # warm-up outside capture (allocator, lazy init)
    torch.cuda.current_stream().wait_stream(stream)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = routing_metadata(static, E)

    for seed in (1, 2):
        static.copy_(topk_experts(T, E, K, make_gen("graph", seed)).cuda())
        graph.replay()
        torch.cuda.synchronize()
        check_metadata(captured, static, E)
        for a, b in zip(captured, routing_metadata(static, E)):
            assert torch.equal(a, b)


I64 = torch.int64
ROUTING_ERRORS = {
    "num-experts": (
        (torch.ones(2, 2, dtype=I64), 0),
        r"num_experts: expected num_experts >= 1, got 0",
    ),
    "experts-1d": (
        (torch.ones(4, dtype=I64), 8),
        r"experts: expected a 2-D tensor \(T, K\), got shape \(4,\)",
    ),
    "experts-3d": (
        (torch.ones(2, 2, 2, dtype=I64), 8),
        r"experts: expected a 2-D tensor \(T, K\), got shape \(2, 2, 2\)",
    ),
    "experts-float": (
        (torch.ones(2, 2), 8),
        r"experts: expected an integer dtype, got torch.float32",
    ),
    "experts-bool": (
        (torch.ones(2, 2, dtype=torch.bool), 8),
        r"experts: expected an integer dtype, got torch.bool",
    ),
}


@pytest.mark.parametrize("name", list(ROUTING_ERRORS))
def test_validation_errors(name):
    args, match = ROUTING_ERRORS[name]
    with pytest.raises(ValueError, match=match):
        routing_metadata(*args)
