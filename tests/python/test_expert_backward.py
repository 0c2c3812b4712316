"""reference.expert_backward (the K4-K8 specification: gradients from x, H, scores and routing
metadata only) against autograd through reference.moe_routed, in float64 on the CPU."""

import pytest
import torch

from sonicmoe import reference
from sonicmoe.routing import routing_metadata


def inputs(T, d, n, E, K, seed, skew=False):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(T, d, generator=gen, dtype=torch.float64)
    w1 = torch.randn(E, 2 * n, d, generator=gen, dtype=torch.float64) * d**-0.5
    w2 = torch.randn(E, d, n, generator=gen, dtype=torch.float64) * n**-0.5
    logits = torch.randn(T, E, generator=gen, dtype=torch.float64)
    if skew:  # one hot expert, several idle ones
        logits[:, 0] += 4.0
        logits[:, E // 2:] -= 50.0
    scores, experts = logits.softmax(-1).topk(K, dim=-1)
    return x, w1, w2, scores, experts


def autograd_grads(x, w1, w2, scores, experts, grad_out):
    leaves = [t.clone().requires_grad_() for t in (x, w1, w2, scores)]
    out = reference.moe_routed(*leaves, experts)
    return torch.autograd.grad(out, leaves, grad_out)


@pytest.mark.parametrize("T,d,n,E,K,skew", [
    (37, 16, 8, 4, 2, False),
    (64, 24, 16, 8, 1, False),
    (50, 16, 8, 8, 3, True),
    (1, 8, 8, 16, 4, False),
    (0, 8, 8, 4, 2, False),
])
def test_matches_autograd_of_the_reference(T, d, n, E, K, skew):
    x, w1, w2, scores, experts = inputs(T, d, n, E, K, seed=T * 7 + E, skew=skew)
    grad_out = torch.randn(T, d, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    meta = routing_metadata(experts, E)
    h = reference.up_projection(x, w1, meta)
    assert h.shape == (T * K, 2 * n)
    got = reference.expert_backward(x, h, w1, w2, scores, meta, grad_out)
    want = autograd_grads(x, w1, w2, scores, experts, grad_out)
    for name, g, w in zip(("dx", "dw1", "dw2", "dscores"), got, want):
        assert g.shape == w.shape, name
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-11, msg=name)


def test_idle_experts_get_exactly_zero_weight_gradients():
    x, w1, w2, scores, experts = inputs(40, 16, 8, 8, 2, seed=3, skew=True)
    meta = routing_metadata(experts, 8)
    idle = (meta.expert_offsets[1:] == meta.expert_offsets[:-1]).nonzero().flatten()
    assert idle.numel() > 0
    _, dw1, dw2, _ = reference.expert_backward(x, reference.up_projection(x, w1, meta), w1, w2,
                                               scores, meta, torch.randn(40, 16, dtype=torch.float64))
    assert (dw1[idle] == 0).all() and (dw2[idle] == 0).all()


def test_bf16_inputs_compute_in_fp32():
    x, w1, w2, scores, experts = inputs(30, 16, 8, 4, 2, seed=5)
    meta = routing_metadata(experts, 4)
    xb, w1b, w2b = x.bfloat16(), w1.bfloat16(), w2.bfloat16()
    h = reference.up_projection(xb, w1b, meta)
    assert h.dtype == torch.float32
    got = reference.expert_backward(xb, h.bfloat16(), w1b, w2b, scores.float(), meta,
                                    torch.ones(30, 16, dtype=torch.bfloat16))
    assert all(g.dtype == torch.float32 for g in got)
    want = autograd_grads(xb.double(), w1b.double(), w2b.double(), scores, experts,
                          torch.ones(30, 16, dtype=torch.float64))
    for g, w in zip(got, want):
        assert ((g.double() - w).norm() / w.norm()) < 1e-2
