"""Routing R: torch.ops.sonicmoe.router_topk, rounding_probs, routing_metadata and router_backward against the
pure-PyTorch routing (GPU), their validation messages (CPU), and the router's score backward (CPU)."""

import re

import pytest
import torch

import sonicmoe
from conftest import requires_extension, requires_kernel_gpu
from sonicmoe._ops import ROUTER_MODES
from sonicmoe.functional import router_scores_backward
from sonicmoe.routing import routing_metadata, scores_from_logits

ROUTINGS = ["topk_softmax", "softmax_topk", "softmax_topk_norm"]


@pytest.mark.parametrize("routing", ROUTINGS)
def test_router_scores_backward_matches_autograd(routing):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(40, 12, generator=gen, dtype=torch.float64, requires_grad=True)
    scores, experts = scores_from_logits(logits, 3, routing)
    grad = torch.randn(scores.shape, generator=gen, dtype=torch.float64)
    (want,) = torch.autograd.grad(scores, logits, grad)
    got = router_scores_backward(logits.detach(), scores.detach(), experts, grad, routing)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    if routing != "softmax_topk":  # what _MoELayer saves for these modes: no logits
        lean = router_scores_backward(None, scores.detach(), experts, grad, routing, num_experts=12)
        torch.testing.assert_close(lean.double(), want, rtol=1e-5, atol=1e-6)


@requires_extension
@pytest.mark.parametrize("args,exc,message", [
    ((torch.zeros(4, 8, dtype=torch.float16), 2, 0), ValueError,
     "router_topk: logits.dtype = Half breaks the rule: must be Float or BFloat16"),
    ((torch.zeros(4, 8), 9, 0), ValueError, "router_topk: top_k = 9 breaks the rule: must be in [1, min(num_experts, 32)]"),
    ((torch.zeros(4, 2048), 2, 0), ValueError, "router_topk: num_experts = 2048 breaks the rule: must be in [1, 1024]"),
    ((torch.zeros(4, 8), 2, 3), ValueError, "router_topk: mode = 3 breaks the rule"),
    ((torch.zeros(4, 8), 2**40, 0), ValueError,
     "router_topk: top_k = 1099511627776 breaks the rule: must fit in int32"),  # named as given, not clamped
    ((torch.zeros(4, 8), 2, 0), ValueError, "router_topk: logits.device = cpu breaks the rule: must be a CUDA device"),
])
def test_router_topk_rejects(args, exc, message):
    with pytest.raises(exc, match=re.escape(message)):
        torch.ops.sonicmoe.router_topk(*args)


@requires_extension
@pytest.mark.parametrize("args,message", [
    ((torch.zeros(4, 8, dtype=torch.float16), 2, True),
     "rounding_probs: logits.dtype = Half breaks the rule: must be Float or BFloat16"),
    ((torch.zeros(4, 8), 9, True), "rounding_probs: top_k = 9 breaks the rule: must be in [1, min(num_experts, 32)]"),
    ((torch.zeros(4, 2048), 2, False), "rounding_probs: num_experts = 2048 breaks the rule: must be in [1, 1024]"),
    ((torch.zeros(8), 2, False), "rounding_probs: logits.shape = [8] breaks the rule: must be 2-D (T, E)"),
    ((torch.zeros(4, 8), 2, True), "rounding_probs: logits.device = cpu breaks the rule: must be a CUDA device"),
])
def test_rounding_probs_rejects(args, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        torch.ops.sonicmoe.rounding_probs(*args)


@requires_extension
@pytest.mark.parametrize("args,message", [
    ((torch.zeros(4, 2), 8), "routing_metadata: experts.dtype = Float breaks the rule: must be Int or Long"),
    ((torch.zeros(4, 2, dtype=torch.int32), 0), "routing_metadata: num_experts = 0 breaks the rule"),
    ((torch.zeros(4, 2, dtype=torch.int32), 2**32), "routing_metadata: num_experts = 4294967296 breaks the rule: "
     "must fit in int32"),
    ((torch.zeros(4, 33, dtype=torch.int32), 64), "routing_metadata: top_k = 33 breaks the rule"),
    ((torch.zeros(4, 2, dtype=torch.int32), 8), "routing_metadata: experts.device = cpu breaks the rule"),
])
def test_routing_metadata_rejects(args, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        torch.ops.sonicmoe.routing_metadata(*args)


@requires_kernel_gpu
@pytest.mark.parametrize("routing", ROUTINGS)
# E covers every slot count the kernel is instantiated for (1, 2, 4, 8, 16 and 32 logits per lane).
@pytest.mark.parametrize("T,E,K", [(0, 8, 2), (1, 8, 1), (1000, 128, 8), (777, 256, 8), (300, 1024, 32),
                                   (513, 33, 5), (200, 64, 4), (260, 512, 8), (90, 32, 8)])
def test_router_topk_matches_torch(routing, T, E, K):
    gen = torch.Generator(device="cuda").manual_seed(T + E + K)
    # Well separated logits: a near-tie may pick either expert (docs/design.md §7). Distinct and within
    # [0, 8), so no probability underflows to a tie at 0 under the full softmax.
    spread = 8.0 / (E * max(T, 1))
    logits = torch.randperm(E * max(T, 1), device="cuda", generator=gen)[: T * E].view(T, E).float() * spread
    scores, experts = sonicmoe.router_topk(logits, K, routing)
    want_scores, want_experts = scores_from_logits(logits, K, routing)
    assert experts.dtype == torch.int32 and scores.dtype == torch.float32
    assert torch.equal(experts.long(), want_experts)
    torch.testing.assert_close(scores, want_scores, rtol=1e-5, atol=1e-6)
    bf16_scores, bf16_experts = sonicmoe.router_topk(logits.bfloat16(), K, routing)
    want_scores, want_experts = scores_from_logits(logits.bfloat16().float(), K, routing)
    torch.testing.assert_close(bf16_scores, want_scores, rtol=1e-5, atol=1e-6)


@requires_kernel_gpu
# 40000 tokens: 1250 chunks, more than one pass of the per-expert chunk scan.
@pytest.mark.parametrize("T,E,K,skew", [(0, 8, 2, False), (1, 4, 1, False), (1000, 128, 8, False),
                                        (4097, 256, 8, True), (333, 1024, 32, False), (64, 7, 7, False),
                                        (40000, 64, 8, True)])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_routing_metadata_matches_torch(T, E, K, skew, index_dtype):
    gen = torch.Generator(device="cuda").manual_seed(T * 3 + E)
    logits = torch.rand(T, E, device="cuda", generator=gen)
    if skew:
        logits[:, 0] += 1.0       # a hot expert
        logits[:, E // 2:] -= 5.0  # idle ones
    experts = logits.topk(K, dim=-1).indices.to(index_dtype)
    got = sonicmoe.device_routing_metadata(experts, E)
    want = routing_metadata(experts, E)
    for name in ("expert_offsets", "gather_idx", "rev_idx"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name


@requires_kernel_gpu
def test_routing_is_capturable_and_deterministic():
    E, K = 64, 4
    logits = torch.randn(2000, E, device="cuda")
    sonicmoe.router_topk(logits, K, "topk_softmax")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        scores, experts = sonicmoe.router_topk(logits, K, "topk_softmax")
        meta = sonicmoe.device_routing_metadata(experts, E)
    logits.copy_(torch.randn_like(logits))
    graph.replay()
    torch.cuda.synchronize()
    first = [t.clone() for t in (scores, experts, *meta)]
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(first, (scores, experts, *meta)))
    assert torch.equal(meta.gather_idx, routing_metadata(experts, E).gather_idx)


@requires_kernel_gpu
def test_opcheck():
    logits = torch.randn(100, 16, device="cuda")
    torch.library.opcheck(torch.ops.sonicmoe.router_topk, (logits, 4, 1))
    experts = logits.topk(4, dim=-1).indices.int()
    torch.library.opcheck(torch.ops.sonicmoe.routing_metadata, (experts, 16))


@requires_kernel_gpu
# E covers every slot count (1 to 32 logits per lane) and an odd one; T a partial last block of 32.
@pytest.mark.parametrize("T,E,K", [(0, 8, 2), (1, 8, 1), (33, 33, 5), (1000, 64, 8), (777, 128, 8),
                                   (300, 256, 8), (260, 512, 8), (95, 1024, 32), (64, 1, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rounding_probs_matches_torch(T, E, K, dtype):
    from sonicmoe._ops import rounding_probs

    gen = torch.Generator(device="cuda").manual_seed(T * 5 + E + K)
    # Distinct logits (bf16 keeps 8 bits: spread over [-4, 4) by a permutation of E values per token).
    logits = (torch.rand(T, E, device="cuda", generator=gen).argsort(dim=-1).float() * (8.0 / E) - 4.0).to(dtype)
    probs, probs_t, chosen_t = rounding_probs(logits, K, True)
    want = logits.float().softmax(dim=-1)
    assert probs.shape == (T, E) and probs_t.shape == chosen_t.shape == (E, T) and chosen_t.dtype == torch.bool
    torch.testing.assert_close(probs, want, rtol=2e-6, atol=1e-7)
    assert torch.equal(probs_t, probs.t())
    chosen = torch.zeros(T, E, dtype=torch.bool, device="cuda").scatter_(1, logits.float().topk(K, -1).indices, True)
    assert torch.equal(chosen_t.t(), chosen)
    lean, lean_t, lean_chosen_t = rounding_probs(logits, K, False)
    assert lean.shape == (0, E) and torch.equal(lean_t, probs_t) and torch.equal(lean_chosen_t, chosen_t)


@requires_kernel_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_rounding_probabilities_backward_matches_the_softmax(dtype):
    # The kernel path's probs carry the softmax's gradient to the logits (fp32 math; bf16 logits
    # get it back in bf16), and the assignment equals the torch path's (fp32 probabilities).
    from sonicmoe.routing import token_rounding_expert_major

    gen = torch.Generator(device="cuda").manual_seed(11)
    logits = torch.randn(1500, 64, device="cuda", generator=gen).to(dtype).requires_grad_()
    probs, probs_t, assigned_t = token_rounding_expert_major(logits, 4, 64, "nearest", fp32_probs=True)
    assert probs.dtype == torch.float32 and probs.requires_grad
    grad = torch.randn(probs.shape, device="cuda", generator=gen)
    (got,) = torch.autograd.grad(probs, logits, grad)
    ref = logits.detach().float().requires_grad_()
    (want,) = torch.autograd.grad(ref.softmax(-1), ref, grad)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), want.to(dtype).float(), rtol=1e-5 if dtype == torch.float32 else 1e-2,
                               atol=1e-7 if dtype == torch.float32 else 1e-4)
    with torch.no_grad():
        _, _, again = token_rounding_expert_major(logits.detach().float(), 4, 64, "nearest")
    assert torch.equal(again, assigned_t)


@requires_kernel_gpu
def test_rounding_probs_opcheck():
    logits = torch.randn(100, 16, device="cuda")
    torch.library.opcheck(torch.ops.sonicmoe.rounding_probs, (logits, 4, True))
    torch.library.opcheck(torch.ops.sonicmoe.rounding_probs, (logits.bfloat16(), 4, False))


# ---------------------------------------------------------------- router_backward (R's backward)

def router_backward_inputs(T, E, K, routing, device, gen, logit_dtype=torch.bfloat16, slots=8):
    """K4's score slots over T * K shuffled rows, rev_idx, and R's scores, experts and logits."""
    logits = torch.randn(T, E, generator=gen, device=device).to(logit_dtype)
    scores, experts = scores_from_logits(logits.float(), K, routing)
    rev_idx = torch.randperm(T * K, generator=gen, device=device).view(T, K).to(torch.int32)
    d_score_partial = torch.randn(T * K, slots, generator=gen, device=device)
    return (d_score_partial, rev_idx, scores.float().contiguous(), experts.to(torch.int32).contiguous(),
            logits if routing == "softmax_topk" else None)


@requires_extension
@pytest.mark.parametrize("name,mutate,message", [
    ("partial dtype", lambda p, r, s, e, l: (p.double(), r, s, e, l, 8, 1),
     "router_backward: d_score_partial.dtype = Double breaks the rule: must be Float"),
    ("experts dtype", lambda p, r, s, e, l: (p, r, s, e.long(), l, 8, 1),
     "router_backward: experts.dtype = Long breaks the rule: must be Int"),
    ("scores shape", lambda p, r, s, e, l: (p, r, s[:, :1].contiguous(), e, l, 8, 1),
     "router_backward: scores.shape = [6, 1] breaks the rule: must equal rev_idx.shape = [6, 2]"),
    ("logits without softmax_topk", lambda p, r, s, e, l: (p, r, s, e, l, 8, 0),
     "router_backward: logits = a tensor breaks the rule: is softmax_topk's (mode 1) alone"),
    ("softmax_topk without logits", lambda p, r, s, e, l: (p, r, s, e, None, 8, 1),
     "router_backward: logits = None breaks the rule: is softmax_topk's (mode 1) alone"),
    ("logits shape", lambda p, r, s, e, l: (p, r, s, e, l, 9, 1),
     "router_backward: logits.shape = [6, 8] breaks the rule: must be (T, num_experts) = (6, 9)"),
    ("num_experts", lambda p, r, s, e, l: (p, r, s, e, None, 2048, 0),
     "router_backward: num_experts = 2048 breaks the rule: must be in [1, 1024]"),
    ("mode past int32", lambda p, r, s, e, l: (p, r, s, e, None, 8, -2**40),
     "router_backward: mode = -1099511627776 breaks the rule: must fit in int32"),
    ("slots", lambda p, r, s, e, l: (p[:, :0], r, s, e, l, 8, 1),
     "router_backward: slots = 0 breaks the rule: must be >= 1"),
    ("device", lambda p, r, s, e, l: (p, r, s, e, l, 8, 1),
     "router_backward: d_score_partial.device = cpu breaks the rule: must be a CUDA device"),
])
def test_router_backward_rejects(name, mutate, message):
    inputs = router_backward_inputs(6, 8, 2, "softmax_topk", "cpu", torch.Generator().manual_seed(1))
    with pytest.raises((TypeError, ValueError), match=re.escape(message)):
        torch.ops.sonicmoe.router_backward(*mutate(*inputs))


@requires_kernel_gpu
@pytest.mark.parametrize("routing", ROUTINGS)
@pytest.mark.parametrize("T,E,K,slots", [(1, 8, 1, 1), (7, 8, 2, 2), (1000, 64, 8, 8), (333, 128, 8, 4),
                                         (257, 256, 8, 16), (100, 1024, 32, 12), (50, 40, 6, 3)])
@pytest.mark.parametrize("logit_dtype", [torch.bfloat16, torch.float32])
def test_router_backward_matches_torch(routing, T, E, K, slots, logit_dtype):
    gen = torch.Generator(device="cuda").manual_seed(T * 7 + E + K)
    d_score_partial, rev_idx, scores, experts, logits = router_backward_inputs(T, E, K, routing, "cuda", gen,
                                                                               logit_dtype, slots)
    torch.full((T * E,), float("nan"), device="cuda", dtype=torch.bfloat16)  # poison the pool
    got = sonicmoe._ops.router_backward(d_score_partial, rev_idx, scores, experts, logits, E, routing)
    d_scores = d_score_partial.double().sum(1)[rev_idx.long()]
    want = router_scores_backward(None if logits is None else logits.double(), scores.double(), experts, d_scores,
                                  routing, num_experts=E).double()
    assert got.shape == (T, E) and got.dtype == torch.bfloat16
    # fp32 math rounded once to bf16: within 2^-8 of each value, and exact zeros off the chosen
    # experts where the mode's gradient is zero there.
    err = (got.double() - want).abs()
    assert bool((err <= 2 ** -8 * want.abs() + 1e-5 * want.abs().max()).all()), float(err.max())
    if routing != "softmax_topk":
        chosen = torch.zeros(T, E, dtype=torch.bool, device="cuda").scatter_(1, experts.long(), True)
        assert bool((got[~chosen] == 0).all())


@requires_extension
@pytest.mark.parametrize("mode,message", [
    (1, "router_backward_rows: mode = 1 breaks the rule: must be 0 (topk_softmax) or 2 (softmax_topk_norm)"),
    (0, "router_backward: d_score_partial.device = cpu breaks the rule: must be a CUDA device"),
])
def test_router_backward_rows_rejects(mode, message):
    p, r, s, e, _ = router_backward_inputs(6, 8, 2, "topk_softmax", "cpu", torch.Generator().manual_seed(1))
    with pytest.raises((TypeError, ValueError), match=re.escape(message)):
        torch.ops.sonicmoe.router_backward_rows(p, r, s, e, 8, mode)


@requires_kernel_gpu
@pytest.mark.parametrize("routing", ["topk_softmax", "softmax_topk_norm"])
@pytest.mark.parametrize("T,E,K,slots", [(1, 8, 1, 1), (1000, 64, 8, 8), (257, 256, 8, 16), (100, 1024, 32, 12)])
def test_router_backward_rows_matches_torch(routing, T, E, K, slots):
    # d_logits as router_backward's, bit for bit, and each (t, k)'s value at its sorted row in fp32
    # (K6's addend_scale), unrounded.
    gen = torch.Generator(device="cuda").manual_seed(T * 5 + E + K)
    d_score_partial, rev_idx, scores, experts, _ = router_backward_inputs(T, E, K, routing, "cuda", gen, slots=slots)
    torch.full((T * K,), float("nan"), device="cuda")  # poison the pool
    d_logits, rows = sonicmoe._ops.router_backward_rows(d_score_partial, rev_idx, scores, experts, E, routing)
    assert torch.equal(d_logits, sonicmoe._ops.router_backward(d_score_partial, rev_idx, scores, experts, None, E,
                                                               routing))
    assert rows.shape == (T * K,) and rows.dtype == torch.float32
    d_scores = d_score_partial.double().sum(1)[rev_idx.long()]
    want = router_scores_backward(None, scores.double(), experts, d_scores, routing, num_experts=E).double()
    want_rows = torch.empty(T * K, dtype=torch.float64, device="cuda")
    want_rows[rev_idx.reshape(-1).long()] = want.gather(1, experts.long()).reshape(-1)
    err = (rows.double() - want_rows).abs()
    assert bool((err <= 1e-5 * want_rows.abs() + 1e-6 * want_rows.abs().max()).all()), float(err.max())
    assert torch.equal(rows[rev_idx.reshape(-1).long()].bfloat16(), d_logits.gather(1, experts.long()).reshape(-1))
    torch.library.opcheck(torch.ops.sonicmoe.router_backward_rows,
                          (d_score_partial, rev_idx, scores, experts, E, ROUTER_MODES[routing]))


@requires_kernel_gpu
def test_router_backward_opcheck_and_graph():
    gen = torch.Generator(device="cuda").manual_seed(5)
    inputs = router_backward_inputs(64, 16, 4, "softmax_topk", "cuda", gen)
    torch.library.opcheck(torch.ops.sonicmoe.router_backward, (*inputs, 16, 1))
    lean = router_backward_inputs(64, 16, 4, "topk_softmax", "cuda", gen)
    torch.library.opcheck(torch.ops.sonicmoe.router_backward, (*lean, 16, 0))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = torch.ops.sonicmoe.router_backward(*inputs, 16, 1)
    inputs[0].copy_(torch.randn_like(inputs[0]))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, torch.ops.sonicmoe.router_backward(*inputs, 16, 1))
