"""sonicmoe.reference against a naive per-token, per-k loop, in float64 on CPU."""

import math
import zlib

import pytest
import torch

import sonicmoe.reference as reference

DTYPE = torch.float64

# (T, E, K): T = 0 and experts that get no tokens (E = 8, T = 1) included.
CASES = [
    (T, E, K)
    for T in (0, 1, 7, 33)
    for E, K in ((1, 1), (4, 1), (4, 2), (4, 4), (8, 2), (8, 8))
]


def case_id(case):
    return "T{}-E{}-K{}".format(*case)


def make_gen(*key):
    # crc32 of the test's parameters: a fixed seed per case, stable across processes.
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def randn(*shape, gen, scale=1.0):
    return torch.randn(*shape, generator=gen, dtype=DTYPE) * scale


def make_weights(E, d, n, gen):
    # Scaled so activations stay O(1) and tolerances mean something.
    w1 = randn(E, 2 * n, d, gen=gen, scale=d**-0.5)
    w2 = randn(E, d, n, gen=gen, scale=n**-0.5)
    return w1, w2


def random_routing(T, E, K, gen):
    """Distinct experts per token, like any top-K router, plus scores in (0, 1)."""
    experts = torch.rand(T, E, generator=gen).argsort(dim=-1)[:, :K]
    scores = torch.rand(T, K, generator=gen, dtype=DTYPE)
    return scores, experts


def sizes(case):
    # Alternate d < n and d > n so gate/up and transposes cannot be confused.
    T, E, K = case
    return (16, 32) if (T + E + K) % 2 else (32, 16)


def naive_moe_routed(x, w1, w2, scores, experts):
    T, d = x.shape
    n = w2.shape[2]
    out = []
    for t in range(T):
        acc = x.new_zeros(d)
        for k in range(experts.shape[1]):
            e = int(experts[t, k])
            h = w1[e] @ x[t]
            gate, up = h[:n], h[n:]
            a = gate * torch.sigmoid(gate) * up
            acc = acc + scores[t, k] * (w2[e] @ a)
        out.append(acc)
    return torch.stack(out) if out else x.new_zeros(0, d)


def naive_route(x, router_weight, top_k, routing):
    """Row by row in plain Python floats."""
    logits = (x @ router_weight.T).tolist()
    all_scores, all_experts = [], []
    for row in logits:
        chosen = sorted(range(len(row)), key=lambda e: -row[e])[:top_k]
        if routing == "topk_softmax":
            z = [math.exp(row[e]) for e in chosen]
            s = [v / sum(z) for v in z]
        else:
            total = sum(math.exp(v) for v in row)
            s = [math.exp(row[e]) / total for e in chosen]
            if routing == "softmax_topk_norm":
                s = [v / sum(s) for v in s]
        all_scores.append(s)
        all_experts.append(chosen)
    K = top_k
    return (
        torch.tensor(all_scores, dtype=x.dtype).reshape(-1, K),
        torch.tensor(all_experts, dtype=torch.int64).reshape(-1, K),
    )


# --------------------------------------------------------------------------- forward


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_moe_routed_matches_naive(case):
    T, E, K = case
    d, n = sizes(case)
    gen = make_gen(case)
    x = randn(T, d, gen=gen)
    w1, w2 = make_weights(E, d, n, gen)
    scores, experts = random_routing(T, E, K, gen)

    out = reference.moe_routed(x, w1, w2, scores, experts)

    assert out.shape == (T, d) and out.dtype == DTYPE
    torch.testing.assert_close(out, naive_moe_routed(x, w1, w2, scores, experts))


def test_moe_routed_int32_ids_and_repeated_experts():
    # Routers never repeat an expert within a token, but the math is well defined.
    gen = make_gen(1)
    T, E, K, d, n = 9, 4, 3, 16, 32
    x = randn(T, d, gen=gen)
    w1, w2 = make_weights(E, d, n, gen)
    experts = torch.randint(0, E, (T, K), generator=gen, dtype=torch.int32)
    experts[0] = 2
    scores = torch.rand(T, K, generator=gen, dtype=DTYPE)

    out = reference.moe_routed(x, w1, w2, scores, experts)

    torch.testing.assert_close(out, naive_moe_routed(x, w1, w2, scores, experts))


def test_moe_routed_empty_tokens():
    gen = make_gen(2)
    x = randn(0, 16, gen=gen)
    w1, w2 = make_weights(4, 16, 32, gen)
    scores = torch.empty(0, 2, dtype=DTYPE)
    experts = torch.empty(0, 2, dtype=torch.int64)

    out = reference.moe_routed(x, w1, w2, scores, experts)

    assert out.shape == (0, 16) and out.dtype == DTYPE


@pytest.mark.parametrize("routing", reference.ROUTING_MODES)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_moe_matches_naive(case, routing):
    T, E, K = case
    d, n = sizes(case)
    gen = make_gen(case, routing)
    x = randn(T, d, gen=gen)
    router_weight = randn(E, d, gen=gen)
    w1, w2 = make_weights(E, d, n, gen)

    out = reference.moe(x, router_weight, w1, w2, K, routing)

    scores, experts = naive_route(x, router_weight, K, routing)
    torch.testing.assert_close(out, naive_moe_routed(x, w1, w2, scores, experts))


@pytest.mark.parametrize("routing", reference.ROUTING_MODES)
def test_moe_leading_batch_dims(routing):
    gen = make_gen(3)
    E, K, d, n = 8, 2, 16, 32
    x = randn(2, 3, 5, d, gen=gen)
    router_weight = randn(E, d, gen=gen)
    w1, w2 = make_weights(E, d, n, gen)

    out = reference.moe(x, router_weight, w1, w2, K, routing)

    assert out.shape == x.shape
    flat = reference.moe(x.reshape(-1, d), router_weight, w1, w2, K, routing)
    torch.testing.assert_close(out, flat.reshape(x.shape))
    one = reference.moe(x[1, 2, 3], router_weight, w1, w2, K, routing)
    torch.testing.assert_close(one, out[1, 2, 3])


# --------------------------------------------------------------------------- route


def test_route_hand_computed():
    # router_weight = I makes the logits equal x.
    x = torch.tensor([[1.0, 3.0, 2.0, 0.5], [0.0, -1.0, 4.0, 2.5]], dtype=DTYPE)
    eye = torch.eye(4, dtype=DTYPE)
    e = math.exp
    z0 = e(1.0) + e(3.0) + e(2.0) + e(0.5)
    z1 = e(0.0) + e(-1.0) + e(4.0) + e(2.5)
    expected_experts = torch.tensor([[1, 2], [2, 3]])
    expected = {
        "topk_softmax": [
            [e(3.0) / (e(3.0) + e(2.0)), e(2.0) / (e(3.0) + e(2.0))],
            [e(4.0) / (e(4.0) + e(2.5)), e(2.5) / (e(4.0) + e(2.5))],
        ],
        "softmax_topk": [[e(3.0) / z0, e(2.0) / z0], [e(4.0) / z1, e(2.5) / z1]],
        "softmax_topk_norm": [
            [e(3.0) / (e(3.0) + e(2.0)), e(2.0) / (e(3.0) + e(2.0))],
            [e(4.0) / (e(4.0) + e(2.5)), e(2.5) / (e(4.0) + e(2.5))],
        ],
    }
    for routing, want in expected.items():
        scores, experts = reference.route(x, eye, 2, routing)
        assert experts.dtype == torch.int64 and scores.dtype == DTYPE
        assert torch.equal(experts, expected_experts), routing
        torch.testing.assert_close(scores, torch.tensor(want, dtype=DTYPE), msg=routing)


@pytest.mark.parametrize("routing", reference.ROUTING_MODES)
@pytest.mark.parametrize("E,K", [(1, 1), (8, 1), (8, 3), (8, 8), (64, 6)])
def test_route_matches_naive(routing, E, K):
    gen = make_gen(routing, E, K)
    x = randn(21, 16, gen=gen)
    router_weight = randn(E, 16, gen=gen)

    scores, experts = reference.route(x, router_weight, K, routing)

    want_scores, want_experts = naive_route(x, router_weight, K, routing)
    assert scores.shape == experts.shape == (21, K)
    assert torch.equal(experts, want_experts)
    torch.testing.assert_close(scores, want_scores)

    sums = scores.sum(dim=-1)
    ones = torch.ones_like(sums)
    if routing == "softmax_topk":
        assert bool((sums <= 1 + 1e-12).all())
        if K < E:
            assert bool((sums < 1).all())
    else:
        torch.testing.assert_close(sums, ones)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_route_keeps_dtype(dtype):
    gen = make_gen(4)
    x = torch.randn(5, 16, generator=gen, dtype=dtype)
    router_weight = torch.randn(8, 16, generator=gen, dtype=dtype)
    for routing in reference.ROUTING_MODES:
        scores, experts = reference.route(x, router_weight, 2, routing)
        assert scores.dtype == dtype and experts.dtype == torch.int64


# --------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_moe_routed_grads_match_naive(case):
    T, E, K = case
    d, n = sizes(case)
    gen = make_gen("grad", case)
    x = randn(T, d, gen=gen)
    w1, w2 = make_weights(E, d, n, gen)
    scores, experts = random_routing(T, E, K, gen)
    grad_out = randn(T, d, gen=gen)
    inputs = [t.requires_grad_() for t in (x, w1, w2, scores)]

    got = torch.autograd.grad(reference.moe_routed(*inputs, experts), inputs, grad_out)
    if T == 0:
        # The naive loop builds no graph for T = 0; the true gradient is zero.
        want = [torch.zeros_like(t) for t in inputs]
    else:
        want = torch.autograd.grad(naive_moe_routed(*inputs, experts), inputs, grad_out)

    for name, g, w in zip(("x", "w1", "w2", "scores"), got, want):
        torch.testing.assert_close(g, w, msg=name)
    # Experts that receive no rows get exactly zero weight gradient.
    idle = torch.ones(E, dtype=torch.bool)
    idle[experts.flatten()] = False
    assert bool((got[1][idle] == 0).all()) and bool((got[2][idle] == 0).all())


def test_moe_routed_gradcheck():
    gen = make_gen(5)
    T, E, K, d, n = 5, 4, 2, 4, 3
    x = randn(T, d, gen=gen).requires_grad_()
    w1, w2 = (w.requires_grad_() for w in make_weights(E, d, n, gen))
    scores, experts = random_routing(T, E, K, gen)
    scores.requires_grad_()

    assert torch.autograd.gradcheck(
        lambda *a: reference.moe_routed(*a, experts), (x, w1, w2, scores)
    )


@pytest.mark.parametrize("routing", reference.ROUTING_MODES)
def test_moe_gradcheck(routing):
    gen = make_gen(6)
    T, E, K, d, n = 4, 5, 2, 6, 3
    x = randn(T, d, gen=gen)
    router_weight = randn(E, d, gen=gen)
    w1, w2 = make_weights(E, d, n, gen)
    # Top-K must not flip under gradcheck's perturbations.
    gaps = (x @ router_weight.T).sort(dim=-1).values.diff(dim=-1)
    assert float(gaps.min()) > 1e-2

    # Weight gradients are covered by the routed tests; x and router_weight reach the
    # router, and keeping the rest constant keeps the finite differences cheap.
    inputs = (x.requires_grad_(), router_weight.requires_grad_())

    def fn(x, router_weight):
        return reference.moe(x, router_weight, w1, w2, K, routing)

    assert torch.autograd.gradcheck(fn, inputs)


# --------------------------------------------------------------------------- validation


def _valid():
    gen = make_gen(7)
    T, E, K, d, n = 3, 4, 2, 8, 6
    x = randn(T, d, gen=gen)
    router_weight = randn(E, d, gen=gen)
    w1, w2 = make_weights(E, d, n, gen)
    scores, experts = random_routing(T, E, K, gen)
    return dict(x=x, rw=router_weight, w1=w1, w2=w2, s=scores, e=experts)


V = _valid()
F32 = torch.float32

ERRORS = {
    "route-token-rounding": (
        lambda: reference.route(V["x"], V["rw"], 2, "token_rounding"),
        ValueError,
        r"routing='token_rounding' gives each token a variable number of experts, so it has no "
        r"\(T, K\) form: use route_token_rounding\(\)",
    ),
    "route-bad-mode": (
        lambda: reference.route(V["x"], V["rw"], 2, "topk"),
        ValueError,
        r"routing: expected one of \('topk_softmax', 'softmax_topk', 'softmax_topk_norm'\), "
        r"got 'topk'",
    ),
    "route-x-3d": (
        lambda: reference.route(V["x"][None], V["rw"], 2),
        ValueError,
        r"x: expected a 2-D tensor \(T, d\), got shape \(1, 3, 8\)",
    ),
    "route-router-weight-d": (
        lambda: reference.route(V["x"], V["rw"][:, :7], 2),
        ValueError,
        r"router_weight: expected shape \(E, d\) with d = 8, got \(4, 7\)",
    ),
    "route-router-weight-dtype": (
        lambda: reference.route(V["x"], V["rw"].to(F32), 2),
        ValueError,
        r"router_weight: expected dtype torch.float64 \(the dtype of x\), got torch.float32",
    ),
    "route-top-k-zero": (
        lambda: reference.route(V["x"], V["rw"], 0),
        ValueError,
        r"top_k: expected 1 <= top_k <= E = 4, got 0",
    ),
    "route-top-k-large": (
        lambda: reference.route(V["x"], V["rw"], 5),
        ValueError,
        r"top_k: expected 1 <= top_k <= E = 4, got 5",
    ),
    "route-top-k-float": (
        lambda: reference.route(V["x"], V["rw"], 2.0),
        TypeError,
        r"top_k: expected an int, got 2.0",
    ),
    "routed-x-1d": (
        lambda: reference.moe_routed(V["x"][0], V["w1"], V["w2"], V["s"], V["e"]),
        ValueError,
        r"x: expected a 2-D tensor \(T, d\), got shape \(8,\)",
    ),
    "routed-w2-d": (
        lambda: reference.moe_routed(V["x"], V["w1"], V["w2"][:, :5], V["s"], V["e"]),
        ValueError,
        r"w2: expected shape \(E, d, n\) with d = 8, got \(4, 5, 6\)",
    ),
    "routed-w2-2d": (
        lambda: reference.moe_routed(V["x"], V["w1"], V["w2"][0], V["s"], V["e"]),
        ValueError,
        r"w2: expected shape \(E, d, n\) with d = 8, got \(8, 6\)",
    ),
    "routed-w1-2n": (
        lambda: reference.moe_routed(V["x"], V["w1"][:, :11], V["w2"], V["s"], V["e"]),
        ValueError,
        r"w1: expected shape \(E, 2n, d\) = \(4, 12, 8\), got \(4, 11, 8\)",
    ),
    "routed-w1-E": (
        lambda: reference.moe_routed(V["x"], V["w1"][:3], V["w2"], V["s"], V["e"]),
        ValueError,
        r"w1: expected shape \(E, 2n, d\) = \(4, 12, 8\), got \(3, 12, 8\)",
    ),
    "routed-w1-dtype": (
        lambda: reference.moe_routed(V["x"], V["w1"].to(F32), V["w2"], V["s"], V["e"]),
        ValueError,
        r"w1: expected dtype torch.float64 \(the dtype of x\), got torch.float32",
    ),
    "routed-w2-dtype": (
        lambda: reference.moe_routed(V["x"], V["w1"], V["w2"].to(F32), V["s"], V["e"]),
        ValueError,
        r"w2: expected dtype torch.float64 \(the dtype of x\), got torch.float32",
    ),
    "routed-scores-T": (
        lambda: reference.moe_routed(V["x"], V["w1"], V["w2"], V["s"][:2], V["e"]),
        ValueError,
        r"scores: expected shape \(T, K\) with T = 3, got \(2, 2\)",
    ),
    "routed-scores-int": (
        lambda: reference.moe_routed(V["x"], V["w1"], V["w2"], V["e"], V["e"]),
        ValueError,
        r"scores: expected a floating-point dtype, got torch.int64",
    ),
    "routed-experts-shape": (
        lambda: reference.moe_routed(V["x"], V["w1"], V["w2"], V["s"], V["e"][:, :1]),
        ValueError,
        r"experts: expected shape \(T, K\) = \(3, 2\), got \(3, 1\)",
    ),
    "routed-experts-float": (
        lambda: reference.moe_routed(V["x"], V["w1"], V["w2"], V["s"], V["e"].double()),
        ValueError,
        r"experts: expected an integer dtype, got torch.float64",
    ),
    "routed-experts-range-high": (
        lambda: reference.moe_routed(V["x"], V["w1"], V["w2"], V["s"], V["e"] + 4),
        ValueError,
        r"experts: expected ids in \[0, E\) = \[0, 4\), got values in \[4, 7\]",
    ),
    "routed-experts-range-low": (
        lambda: reference.moe_routed(V["x"], V["w1"], V["w2"], V["s"], V["e"] - 1),
        ValueError,
        r"experts: expected ids in \[0, E\) = \[0, 4\), got values in \[-1, 2\]",
    ),
    "moe-token-rounding-rule": (
        lambda: reference.moe(V["x"], V["rw"], V["w1"], V["w2"], 2, "token_rounding", rule="even"),
        ValueError,
        r"rule: expected one of \('nearest', 'up', 'down'\), got 'even'",
    ),
    "moe-bad-mode": (
        lambda: reference.moe(V["x"], V["rw"], V["w1"], V["w2"], 2, "softmax"),
        ValueError,
        r"routing: expected one of .*, got 'softmax'",
    ),
    "moe-x-scalar": (
        lambda: reference.moe(V["x"][0, 0], V["rw"], V["w1"], V["w2"], 2),
        ValueError,
        r"x: expected shape \(\.\.\., d\), got shape \(\)",
    ),
    "moe-router-weight-d": (
        lambda: reference.moe(V["x"], V["rw"].T, V["w1"], V["w2"], 2),
        ValueError,
        r"router_weight: expected shape \(E, d\) with d = 8, got \(8, 4\)",
    ),
    "moe-w2-E": (
        lambda: reference.moe(V["x"], V["rw"], V["w1"], V["w2"][:3], 2),
        ValueError,
        r"w2: expected shape \(E, d, n\) with \(E, d\) = \(4, 8\), got \(3, 8, 6\)",
    ),
    "moe-w1-E": (
        lambda: reference.moe(V["x"], V["rw"], V["w1"][:3], V["w2"], 2),
        ValueError,
        r"w1: expected shape \(E, 2n, d\) = \(4, 12, 8\), got \(3, 12, 8\)",
    ),
    "moe-top-k": (
        lambda: reference.moe(V["x"], V["rw"], V["w1"], V["w2"], 9),
        ValueError,
        r"top_k: expected 1 <= top_k <= E = 4, got 9",
    ),
}


@pytest.mark.parametrize("name", list(ERRORS))
def test_validation_errors(name):
    fn, exc, match = ERRORS[name]
    with pytest.raises(exc, match=match):
        fn()
