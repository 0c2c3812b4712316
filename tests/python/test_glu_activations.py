"""The gated activations beside SwiGLU (activation= of moe / moe_routed / MoE): GeGLU (GELU in its
tanh form) and ReGLU. On the CPU: the reference's math (forward against a plain per-expert
loop, its analytic backward against autograd and gradcheck in float64), the argument's rule,
and the layer's CPU path with each activation. The kernels' epilogues are tested on the GPU
(test_up_proj.py, test_backward_kernels.py, test_moe.py) and the layer's kernel path on
emulated ops (test_layer_emulated.py)."""

import re
import zlib

import pytest
import torch
import torch.nn.functional as F

import sonicmoe
from conftest import requires_extension
from sonicmoe import _ops, reference

ACTIVATIONS = ["swiglu", "geglu", "reglu"]
# The plain torch form of act(gate), written without sonicmoe.
PLAIN_ACT = {"swiglu": F.silu, "geglu": lambda g: F.gelu(g, approximate="tanh"), "reglu": torch.relu}


def gen(*key):
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def layer(T, d, n, E, key, dtype=torch.float64):
    g = gen(*key)
    x = torch.randn(T, d, generator=g, dtype=dtype)
    router = torch.randn(E, d, generator=g, dtype=dtype) * d**-0.5
    w1 = torch.randn(E, 2 * n, d, generator=g, dtype=dtype) * d**-0.5
    w2 = torch.randn(E, d, n, generator=g, dtype=dtype) * n**-0.5
    return x, router, w1, w2


def loop_moe_routed(x, w1, w2, scores, experts, activation):
    """out[t] = sum_k scores[t, k] * w2[e] @ (act(w1[e, :n] @ x[t]) * (w1[e, n:] @ x[t])), token by token."""
    n = w2.shape[2]
    act = PLAIN_ACT[activation]
    rows = []
    for t in range(x.shape[0]):
        acc = torch.zeros_like(x[t])
        for k in range(experts.shape[1]):
            e = int(experts[t, k])
            gate, up = w1[e, :n] @ x[t], w1[e, n:] @ x[t]
            acc = acc + scores[t, k] * (w2[e] @ (act(gate) * up))
        rows.append(acc)
    return torch.stack(rows) if rows else x.new_zeros(0, x.shape[1])


# ------------------------------------------------------------------ the math

def test_the_table_is_one_and_exported():
    assert sonicmoe.GLU_ACTIVATIONS == {"swiglu": 0, "geglu": 1, "reglu": 2}
    assert reference.GLU_ACTIVATIONS is _ops.GLU_ACTIVATIONS is sonicmoe.GLU_ACTIVATIONS


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_activation_is_the_plain_torch_one(activation):
    g = torch.linspace(-6, 6, 1201, dtype=torch.float64)
    torch.testing.assert_close(reference.glu_activation(g, activation), PLAIN_ACT[activation](g), rtol=0, atol=0)


def test_geglu_is_gelus_tanh_form_not_erf():
    g = torch.linspace(-4, 4, 801, dtype=torch.float64)
    tanh_form = 0.5 * g * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (g + 0.044715 * g**3)))
    torch.testing.assert_close(reference.glu_activation(g, "geglu"), tanh_form, rtol=1e-12, atol=1e-12)
    assert (reference.glu_activation(g, "geglu") - F.gelu(g)).abs().max() > 1e-4  # erf's GELU differs


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_analytic_derivative_matches_autograd(activation):
    # Gates away from ReLU's kink at 0, where autograd and the kernel agree on 0 for g <= 0.
    g = torch.linspace(-8, 8, 1600, dtype=torch.float64).add(0.005).requires_grad_(True)
    (auto,) = torch.autograd.grad(PLAIN_ACT[activation](g).sum(), g)
    torch.testing.assert_close(reference.glu_activation_grad(g.detach(), activation), auto, rtol=1e-12, atol=1e-12)


def test_reglu_derivative_is_zero_at_and_below_zero():
    g = torch.tensor([-1.0, -0.0, 0.0, 1e-30, 2.0])
    assert reference.glu_activation_grad(g, "reglu").tolist() == [0.0, 0.0, 0.0, 1.0, 1.0]


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_glu_backward_is_autograd_of_the_plain_formulation(activation):
    n = 48
    h = torch.randn(37, 2 * n, dtype=torch.float64, generator=gen("h", activation)).requires_grad_(True)
    d_a = torch.randn(37, n, dtype=torch.float64, generator=gen("da", activation))
    a = PLAIN_ACT[activation](h[:, :n]) * h[:, n:]
    (want,) = torch.autograd.grad(a, h, d_a)
    torch.testing.assert_close(reference.glu(h.detach(), activation), a.detach(), rtol=0, atol=0)
    torch.testing.assert_close(reference.glu_backward(h.detach(), d_a, activation), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_glu_gradcheck(activation):
    h = torch.randn(5, 16, dtype=torch.float64, generator=gen("gc", activation)).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda h: reference.glu(h, activation), (h,))


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_reference_moe_routed_against_a_token_loop_and_gradcheck(activation):
    T, d, n, E, K = 11, 12, 8, 4, 2
    x, router, w1, w2 = layer(T, d, n, E, ("routed", activation))
    scores, experts = reference.route(x, router, K)
    out = reference.moe_routed(x, w1, w2, scores, experts, activation=activation)
    torch.testing.assert_close(out, loop_moe_routed(x, w1, w2, scores, experts, activation), rtol=1e-12, atol=1e-12)
    leaves = [t.detach().requires_grad_(True) for t in (x, w1, w2, scores)]
    assert torch.autograd.gradcheck(
        lambda x, w1, w2, s: reference.moe_routed(x, w1, w2, s, experts, activation=activation), leaves)


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_reference_dense_routed_and_token_rounding(activation):
    T, d, n, E, K = 24, 16, 8, 4, 2
    x, router, w1, w2 = layer(T, d, n, E, ("dense", activation))
    scores, assigned = reference.route_token_rounding(x, router, K, tile=4)
    out = reference.moe_dense_routed(x, w1, w2, scores, assigned, activation=activation)
    t_idx, e_idx = assigned.nonzero(as_tuple=True)
    want = torch.zeros_like(x)
    for t, e in zip(t_idx.tolist(), e_idx.tolist()):
        gate, up = w1[e, :n] @ x[t], w1[e, n:] @ x[t]
        want[t] += scores[t, e] * (w2[e] @ (PLAIN_ACT[activation](gate) * up))
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(reference.moe(x, router, w1, w2, K, "token_rounding", tile=4, activation=activation),
                               out)


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_expert_backward_is_autograd_of_moe_routed(activation):
    # The kernels' split of the backward (K4's dGLU from H) against autograd of the forward.
    T, d, n, E, K = 20, 16, 8, 4, 2
    x, router, w1, w2 = layer(T, d, n, E, ("expert-backward", activation))
    scores, experts = reference.route(x, router, K)
    meta = sonicmoe.routing_metadata(experts, E)
    h = reference.up_projection(x, w1, meta)
    g = torch.randn(T, d, dtype=torch.float64, generator=gen("g", activation))
    leaves = [t.detach().requires_grad_(True) for t in (x, w1, w2, scores)]
    reference.moe_routed(*leaves, experts, activation=activation).backward(g)
    got = reference.expert_backward(x, h, w1, w2, scores, meta, g, activation)
    for name, mine, leaf in zip(("dx", "dw1", "dw2", "dscores"), got, leaves):
        torch.testing.assert_close(mine, leaf.grad, rtol=1e-10, atol=1e-10, msg=name)


# ------------------------------------------------------------------ the argument's rule

RULE = ("breaks the rule: must be one of 'swiglu', 'geglu', 'reglu' (gated activations; non-gated ones such as "
        "'relu2' and 'gelu' are not supported)")


@pytest.mark.parametrize("bad", ["gelu", "relu2", "relu", "SwiGLU", "silu", "", None, 0])
@pytest.mark.parametrize("entry", ["moe", "moe_routed", "MoE", "reference.moe", "reference.moe_routed", "up_proj",
                                   "expert_parallel"])
def test_activation_is_refused_by_rule(entry, bad):
    x, router, w1, w2 = layer(6, 16, 8, 4, ("bad",), torch.float32)
    scores, experts = reference.route(x, router, 2)
    calls = {
        "moe": lambda: sonicmoe.moe(x, router, w1, w2, 2, activation=bad),
        "moe_routed": lambda: sonicmoe.moe_routed(x, w1, w2, scores, experts, activation=bad),
        "MoE": lambda: sonicmoe.MoE(16, 8, 4, 2, activation=bad),
        "reference.moe": lambda: reference.moe(x, router, w1, w2, 2, activation=bad),
        "reference.moe_routed": lambda: reference.moe_routed(x, w1, w2, scores, experts, activation=bad),
        # checked before the extension is needed: the same error with or without a build
        "up_proj": lambda: _ops._activation_number(bad),
        # checked before the group is read
        "expert_parallel": lambda: sonicmoe.parallel.moe_routed_expert_parallel(x, w1, w2, scores, experts, 4, None,
                                                                                activation=bad),
    }
    with pytest.raises(ValueError, match=re.escape(f"activation = {bad!r} {RULE}")):
        calls[entry]()


def test_ops_wrappers_pass_the_activations_number(monkeypatch):
    # sonicmoe.up_proj / down_proj_grad hand the ops the GluActivation number (csrc/sonicmoe.h).
    seen = []
    monkeypatch.setattr(_ops, "_C", object())
    monkeypatch.setattr(torch.ops.sonicmoe, "up_proj", lambda *args: seen.append(("up_proj", args[-1])),
                        raising=False)
    monkeypatch.setattr(torch.ops.sonicmoe, "down_proj_grad", lambda *args: seen.append(("down_proj_grad", args[-1])),
                        raising=False)
    for name, number in sonicmoe.GLU_ACTIVATIONS.items():
        _ops.up_proj(None, None, None, None, activation=name)
        _ops.down_proj_grad(None, None, None, None, None, None, activation=name)
    _ops.up_proj(None, None, None, None)
    _ops.down_proj_grad(None, None, None, None, None, None)
    assert seen == [(op, n) for n in (0, 1, 2) for op in ("up_proj", "down_proj_grad")] + [
        ("up_proj", 0), ("down_proj_grad", 0)]


@requires_extension
def test_fakes_take_the_activation():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(100, 256, dtype=torch.bfloat16)
        w1 = torch.empty(8, 1024, 256, dtype=torch.bfloat16)
        w2 = torch.empty(8, 256, 512, dtype=torch.bfloat16)
        offs = torch.empty(9, dtype=torch.int32)
        gather_idx = torch.empty(800, dtype=torch.int32)
        for activation in sonicmoe.GLU_ACTIVATIONS.values():
            h, a = torch.ops.sonicmoe.up_proj(x, w1, offs, gather_idx, True, False, 0, activation)
            d_h, a_scaled, ds = torch.ops.sonicmoe.down_proj_grad(x, w2, h, torch.empty(800), offs, gather_idx,
                                                                  False, 0, activation)
            assert h.shape == (800, 1024) and a.shape == (800, 512)
            assert d_h.shape == (800, 1024) and a_scaled.shape == (800, 512) and ds.shape == (800, 4)


# ------------------------------------------------------------------ the layer's CPU path

@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_moe_routed_on_the_cpu_against_a_token_loop(activation):
    T, d, n, E, K = 9, 16, 8, 4, 2
    x, router, w1, w2 = layer(T, d, n, E, ("cpu-routed", activation))
    scores, experts = reference.route(x, router, K)
    leaves = [t.detach().requires_grad_(True) for t in (x, w1, w2, scores)]
    out = sonicmoe.moe_routed(*leaves, experts, activation=activation)
    plain = [t.detach().requires_grad_(True) for t in (x, w1, w2, scores)]
    want = loop_moe_routed(*plain, experts, activation)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    g = torch.randn(T, d, dtype=torch.float64, generator=gen("g-cpu", activation))
    out.backward(g)
    want.backward(g)
    for name, a, b in zip(("x", "w1", "w2", "scores"), leaves, plain):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-10, msg=name)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("routing", ["topk_softmax", "softmax_topk_norm", "token_rounding"])
def test_moe_and_module_on_the_cpu_against_a_loop(routing, activation):
    T, d, n, E, K = 12, 16, 8, 4, 2
    x, router, w1, w2 = layer(T, d, n, E, ("cpu-moe", routing, activation))
    out = sonicmoe.moe(x.view(3, 4, d), router, w1, w2, K, routing=routing, tile=4, activation=activation)
    if routing == "token_rounding":
        scores, assigned = reference.route_token_rounding(x, router, K, tile=4)
        t_idx, e_idx = assigned.nonzero(as_tuple=True)
        experts = torch.full((T, E), 0, dtype=torch.long)
        weights = torch.zeros(T, E, dtype=x.dtype)
        for t, e in zip(t_idx.tolist(), e_idx.tolist()):
            experts[t, e], weights[t, e] = e, scores[t, e]
        want = loop_moe_routed(x, w1, w2, weights, experts, activation)  # weight 0 where not assigned
    else:
        # sonicmoe.moe's router: softmax and top-K in fp32
        scores, experts = sonicmoe.routing.scores_from_logits((x @ router.t()).float(), K, routing)
        want = loop_moe_routed(x, w1, w2, scores.double(), experts, activation)
    torch.testing.assert_close(out.view(T, d), want, rtol=1e-12, atol=1e-12)

    module = sonicmoe.MoE(d, n, E, K, routing=routing, tile=4, dtype=torch.float64, activation=activation)
    assert module.activation == activation and f"activation={activation!r}" in repr(module)
    with torch.no_grad():
        module.router_weight.copy_(router), module.w1.copy_(w1), module.w2.copy_(w2)
    torch.testing.assert_close(module(x), out.view(T, d))


def test_default_is_swiglu():
    x, router, w1, w2 = layer(8, 16, 8, 4, ("default",))
    torch.testing.assert_close(sonicmoe.moe(x, router, w1, w2, 2), sonicmoe.moe(x, router, w1, w2, 2,
                                                                                  activation="swiglu"))
    assert sonicmoe.MoE(16, 8, 4, 2).activation == "swiglu"
    with pytest.raises(AssertionError):  # and the activation is used
        torch.testing.assert_close(sonicmoe.moe(x, router, w1, w2, 2), sonicmoe.moe(x, router, w1, w2, 2,
                                                                                      activation="geglu"))
