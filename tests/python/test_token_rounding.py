"""Token rounding (docs/design.md §6): the routing invariants, on the CPU and, when present, CUDA."""

import zlib

import pytest
import torch

import sonicmoe
from sonicmoe import reference
from sonicmoe.routing import _assign_by_sort, _rounded_counts, token_rounding

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")),
]


def make_logits(T, E, device, key, skew=0.0):
    gen = torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))
    logits = torch.randn(T, E, generator=gen, dtype=torch.float64)
    # skew > 0 piles tokens onto the low-numbered experts and starves the others.
    logits += skew * torch.linspace(1.0, -1.0, E, dtype=torch.float64)
    return logits.to(device)


def check_invariants(logits, top_k, tile, rule):
    T, E = logits.shape
    scores, assigned = token_rounding(logits, top_k, tile, rule)
    probs = logits.softmax(-1)
    chosen = torch.zeros_like(assigned).scatter_(1, logits.topk(top_k, -1).indices, True)
    f = chosen.sum(0).cpu()
    count = assigned.sum(0).cpu()

    assert scores.shape == assigned.shape == (T, E) and assigned.dtype == torch.bool
    torch.testing.assert_close(scores, probs * assigned)  # added tokens carry their probability
    assert (((count % tile) == 0) | (count == T)).all(), "count not a multiple of the tile"
    assert ((count - f).abs() < tile).all(), "an expert deviates from top-K by a tile or more"
    if rule == "up":
        assert (count >= f).all()
    if rule == "down":
        assert (count <= f).all()
    if rule == "nearest":
        assert (((count - f).abs() <= tile // 2) | (count == T)).all()

    for e in range(E):
        kept, dropped = assigned[:, e] & chosen[:, e], ~assigned[:, e] & chosen[:, e]
        added, left = assigned[:, e] & ~chosen[:, e], ~assigned[:, e] & ~chosen[:, e]
        if added.any():  # every top-K choice outranks every added token
            assert not dropped.any()
        p = probs[:, e]
        if kept.any() and dropped.any():
            assert p[kept].min() >= p[dropped].max()
        if added.any() and left.any():
            assert p[added].min() >= p[left].max()
    return scores, assigned


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rule", ["nearest", "up", "down"])
@pytest.mark.parametrize("T,E,K,tile,skew", [
    (1000, 16, 2, 32, 0.0), (1000, 16, 2, 32, 4.0), (4096, 64, 8, 128, 0.0),
    (300, 8, 1, 128, 0.0), (50, 4, 2, 128, 0.0), (2000, 256, 8, 16, 6.0), (0, 8, 2, 128, 0.0),
])
def test_invariants(device, rule, T, E, K, tile, skew):
    check_invariants(make_logits(T, E, device, (T, E, K, skew)), K, tile, rule)


@pytest.mark.parametrize("device", DEVICES)
def test_deterministic_for_a_fixed_input(device):
    logits = make_logits(3000, 32, device, "det").float()
    first = token_rounding(logits, 4, 64)
    for _ in range(3):
        again = token_rounding(logits, 4, 64)
        assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rule", ["nearest", "up", "down"])
@pytest.mark.parametrize("T,E,K,tile,ties", [
    (1000, 16, 2, 32, False), (4096, 64, 8, 128, False), (300, 8, 1, 128, False),
    (50, 4, 2, 128, False), (2000, 256, 8, 16, True), (700, 32, 4, 64, True), (5, 3, 1, 1, False),
])
def test_bounded_topk_matches_the_sort(device, rule, T, E, K, tile, ties):
    # The fp32 path (bounded top-k) and the float64 path (the rule as a sort) pick the same
    # tokens, ties included (coarse logits repeat probabilities; the tie goes to the lower token).
    logits = make_logits(T, E, device, (T, E, K, "sort")).float()
    if ties:
        logits = (logits * 2).round() / 2
    probs = logits.softmax(-1)
    chosen = torch.zeros(T, E, dtype=torch.bool, device=device)
    chosen.scatter_(1, logits.topk(K, -1).indices, True)
    _, fast = token_rounding(logits, K, tile, rule)
    target = _rounded_counts(chosen.sum(0), T, tile, rule)
    assert torch.equal(fast, _assign_by_sort(probs, chosen, target)), "different tokens"
    check_invariants(logits, K, tile, rule)


def test_tiles_already_full_change_nothing():
    # Every expert receives exactly 2 tiles of tokens under top-1: rounding is the identity.
    T, E, tile = 512, 2, 128
    logits = torch.zeros(T, E, dtype=torch.float64)
    logits[: T // 2, 0] = 5.0
    logits[T // 2:, 1] = 5.0
    _, assigned = token_rounding(logits, 1, tile)
    chosen = torch.zeros_like(assigned).scatter_(1, logits.topk(1, -1).indices, True)
    assert torch.equal(assigned, chosen)


def test_gradients_flow_through_the_scores_to_the_router():
    gen = torch.Generator().manual_seed(5)
    T, d, n, E, K = 24, 8, 4, 4, 2
    x = torch.randn(T, d, generator=gen, dtype=torch.float64)
    w1 = torch.randn(E, 2 * n, d, generator=gen, dtype=torch.float64) * d**-0.5
    w2 = torch.randn(E, d, n, generator=gen, dtype=torch.float64) * n**-0.5
    router = torch.randn(E, d, generator=gen, dtype=torch.float64).requires_grad_(True)
    torch.autograd.gradcheck(
        lambda r: reference.moe(x, r, w1, w2, K, "token_rounding", tile=4), (router,))


def test_layer_rounds_in_training_and_uses_top_k_in_eval():
    layer = sonicmoe.MoE(32, 16, 8, 2, routing="token_rounding", tile=16, dtype=torch.float64)
    x = torch.randn(100, 32, dtype=torch.float64)
    train_out = layer(x)
    expected = reference.moe(x, layer.router_weight, layer.w1, layer.w2, 2, "token_rounding", tile=16)
    torch.testing.assert_close(train_out, expected)
    layer.eval()
    torch.testing.assert_close(
        layer(x), reference.moe(x, layer.router_weight, layer.w1, layer.w2, 2, "softmax_topk"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graph_capture_proves_no_host_sync():
    logits = make_logits(2048, 64, "cuda", "graph").float()
    token_rounding(logits, 8, 128)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        scores, assigned = token_rounding(logits, 8, 128)
    logits.copy_(make_logits(2048, 64, "cuda", "graph-2").float())
    graph.replay()
    expected = token_rounding(logits, 8, 128)
    assert torch.equal(scores, expected[0]) and torch.equal(assigned, expected[1])


# ---------------------------------------------------------------- the kernel path (GPU)

from conftest import requires_kernel_gpu  # noqa: E402

# d 4096, n 256: K1 and K4 on the clustered wide tile over upper-bound buffers (auto at d >= 3072).
KERNEL_CASES = [(1000, 256, 128, 16, 2, 128, "nearest"), (4096, 512, 256, 64, 8, 128, "up"),
                (300, 128, 64, 8, 1, 64, "down"), (1, 128, 64, 8, 2, 128, "nearest"),
                (700, 4096, 256, 16, 2, 128, "nearest")]


@requires_kernel_gpu
@pytest.mark.parametrize("T,d,n,E,K,tile,rule", KERNEL_CASES)
def test_moe_token_rounding_on_the_kernels(T, d, n, E, K, tile, rule):
    from sonicmoe.routing import dense_routing_metadata, dense_row_bound

    gen = torch.Generator(device="cuda").manual_seed(T + E)
    x = torch.randn(T, d, device="cuda", generator=gen).bfloat16()
    router = (torch.randn(E, d, device="cuda", generator=gen) * d**-0.5).bfloat16()
    w1 = (torch.randn(E, 2 * n, d, device="cuda", generator=gen) * d**-0.5).bfloat16()
    w2 = (torch.randn(E, d, n, device="cuda", generator=gen) * n**-0.5).bfloat16()
    out = sonicmoe.moe(x, router, w1, w2, K, routing="token_rounding", tile=tile, rule=rule)
    # The same routing decisions, then the fp32 reference.
    scores, assigned = token_rounding(torch.nn.functional.linear(x, router).float(), K, tile, rule)
    ref = reference.moe_dense_routed(x.float(), w1.float(), w2.float(), scores, assigned)
    assert torch.isfinite(out).all()
    if not ref.any():  # rounding down dropped every pair: the layer outputs exact zeros
        assert not out.any()
    else:
        assert ((out.float() - ref).norm() / ref.norm()) <= 1e-2
    meta = dense_routing_metadata(scores, assigned, dense_row_bound(T, E, K, tile))
    assert int(meta.expert_offsets[-1]) == int(assigned.sum())


@requires_kernel_gpu
def test_token_rounding_forward_captures_in_a_cuda_graph():
    x = torch.randn(2048, 256, device="cuda").bfloat16()
    router = (torch.randn(32, 256, device="cuda") * 0.06).bfloat16()
    w1 = (torch.randn(32, 256, 256, device="cuda") * 0.06).bfloat16()
    w2 = (torch.randn(32, 256, 128, device="cuda") * 0.09).bfloat16()
    with torch.no_grad():
        sonicmoe.moe(x, router, w1, w2, 4, routing="token_rounding")
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = sonicmoe.moe(x, router, w1, w2, 4, routing="token_rounding")
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        again = sonicmoe.moe(x, router, w1, w2, 4, routing="token_rounding")
    assert torch.equal(out, again)


@requires_kernel_gpu
@pytest.mark.parametrize("T,d,n,E,K,tile,rule", KERNEL_CASES)
@pytest.mark.parametrize("full_probs", [False, True])
def test_token_rounding_backward_on_the_kernels(T, d, n, E, K, tile, rule, full_probs):
    # The kernels' backward over the dense layout against the fp32 reference with the same
    # routing decisions: dx, dw1, dw2 and dscores (at the assigned pairs; zero elsewhere).
    # full_probs: the layer passes the router's probabilities unmasked (read only where assigned).
    from sonicmoe.functional import _MoEDenseExperts
    from sonicmoe.routing import token_rounding_expert_major

    gen = torch.Generator(device="cuda").manual_seed(T * 7 + E)
    x = torch.randn(T, d, device="cuda", generator=gen).bfloat16()
    router = (torch.randn(E, d, device="cuda", generator=gen) * d**-0.5).bfloat16()
    w1 = (torch.randn(E, 2 * n, d, device="cuda", generator=gen) * d**-0.5).bfloat16()
    w2 = (torch.randn(E, d, n, device="cuda", generator=gen) * n**-0.5).bfloat16()
    logits = torch.nn.functional.linear(x, router).float()
    scores, assigned = token_rounding(logits, K, tile, rule)
    probs, probs_t, assigned_t = token_rounding_expert_major(logits, K, tile, rule)
    assert torch.equal(assigned_t.t(), assigned)
    grad = torch.randn(T, d, device="cuda", generator=gen).bfloat16()
    leaves = [t.detach().requires_grad_() for t in (x, w1, w2, probs if full_probs else scores)]
    out = _MoEDenseExperts.apply(*leaves, probs_t if full_probs else scores.t(), assigned_t, K, tile, True,
                                  "swiglu")
    out.backward(grad)
    ref_leaves = [t.detach().float().requires_grad_() for t in (x, w1, w2, scores)]
    reference.moe_dense_routed(*ref_leaves, assigned).backward(grad.float())

    def rel(a, b):
        return float((a.float() - b).norm() / b.norm().clamp_min(1e-30))

    for name, got, want in zip(("dx", "dw1", "dw2"), leaves[:3], ref_leaves[:3]):
        assert torch.isfinite(got.grad).all(), name
        assert rel(got.grad, want.grad) <= 1e-2, name
    ds, want_ds = leaves[3].grad, ref_leaves[3].grad
    assert rel(ds[assigned], want_ds[assigned]) <= 1e-2
    assert not ds[~assigned].any()
    idle = ~assigned.any(dim=0)  # experts with no tokens: exactly zero weight gradient
    assert not leaves[1].grad[idle].any() and not leaves[2].grad[idle].any()


@requires_kernel_gpu
def test_token_rounding_layer_trains_on_the_kernels():
    # Through sonicmoe.moe: the router, x and the weights all get finite, nonzero gradients.
    gen = torch.Generator(device="cuda").manual_seed(11)
    T, d, n, E, K = 2048, 256, 128, 32, 4
    x = torch.randn(T, d, device="cuda", generator=gen).bfloat16().requires_grad_()
    router = (torch.randn(E, d, device="cuda", generator=gen) * d**-0.5).bfloat16().requires_grad_()
    w1 = (torch.randn(E, 2 * n, d, device="cuda", generator=gen) * d**-0.5).bfloat16().requires_grad_()
    w2 = (torch.randn(E, d, n, device="cuda", generator=gen) * n**-0.5).bfloat16().requires_grad_()
    sonicmoe.moe(x, router, w1, w2, K, routing="token_rounding").square().mean().backward()
    for name, t in (("x", x), ("router", router), ("w1", w1), ("w2", w2)):
        assert torch.isfinite(t.grad).all() and t.grad.abs().sum() > 0, name


@requires_kernel_gpu
@pytest.mark.parametrize("rule", [0, 1, 2])
def test_assign_kernel_on_unaligned_rows_matches_the_aligned(rule):
    # token_rounding_assign reads 4-token chunks when T % 4 == 0 and its rows are aligned; a
    # contiguous view that starts one element into its storage takes the token-at-a-time path.
    from sonicmoe._ops import token_rounding_assign

    T, E, K, tile = 1024, 16, 2, 64
    logits = make_logits(T, E, "cuda", ("unaligned", rule)).float()
    probs_t = logits.softmax(-1).t().contiguous()
    chosen_t = torch.zeros(E, T, dtype=torch.bool, device="cuda").scatter_(0, logits.topk(K, -1).indices.t(), True)
    want, want_counts = token_rounding_assign(probs_t, chosen_t, tile, rule)
    shifted_probs = torch.empty(E * T + 1, device="cuda")[1:].view(E, T).copy_(probs_t)
    shifted_chosen = torch.empty(E * T + 1, dtype=torch.bool, device="cuda")[1:].view(E, T).copy_(chosen_t)
    got, got_counts = token_rounding_assign(shifted_probs, shifted_chosen, tile, rule)
    assert torch.equal(got, want) and torch.equal(got_counts, want_counts)
    assert torch.equal(want.sum(1).int(), want_counts)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("rule", [0, 1, 2])
@pytest.mark.parametrize("T,E,K,tile,grid", [
    (4096, 64, 8, 128, 0), (1001, 128, 4, 64, 64), (2048, 129, 4, 32, 0), (4096, 512, 8, 128, 0),
    (1002, 300, 2, 16, 64), (8192, 8, 2, 128, 4), (8192, 16, 4, 128, 4), (8190, 16, 4, 128, 4),
])
def test_assign_kernel_matches_the_bounded_topk(rule, T, E, K, tile, grid):
    # token_rounding_assign (both block sizes: 1024 threads where E <= 128; 4-token chunks where
    # T % 4 == 0) against the torch rule on the same probabilities, exactly. grid: probabilities
    # rounded to multiples of 1 / grid, so that the threshold's ties are taken by token index. At
    # grid 4, T 8192, E 8 the threshold's first-digit bin lists up to ~1900 candidates (the list
    # in shared memory holds 2048); at E 16 some experts' bins hold 5000-7000, more than the list
    # holds, so the kernel takes the later digits by passes over the row (counted on CPU; both
    # directions, at T % 4 == 0 and != 0).
    from sonicmoe._ops import token_rounding_assign
    from sonicmoe.routing import TOKEN_ROUNDING_RULES, _assign_by_bounded_topk, _rounded_counts

    probs = make_logits(T, E, "cpu", ("assign", T, E, rule)).float().softmax(-1)
    if grid:
        probs = (probs * grid).round() / grid
    chosen = torch.zeros(T, E, dtype=torch.bool).scatter_(1, probs.topk(K, -1).indices, True)
    counts = chosen.sum(0)
    target = _rounded_counts(counts, T, tile, TOKEN_ROUNDING_RULES[rule])
    want = _assign_by_bounded_topk(probs, chosen, counts, target, tile)
    got, got_counts = token_rounding_assign(probs.t().contiguous().cuda(), chosen.t().contiguous().cuda(), tile, rule)
    assert torch.equal(got.cpu(), want)
    assert torch.equal(got_counts.cpu(), target.int())
