"""sonicmoe.moe / moe_routed / MoE against sonicmoe.reference in fp32.

Routing decisions are taken once and shared (docs/design.md §7: near-ties flip under bf16), so the
comparison is of the expert math and the combine, forward and backward."""

import re
import types
import zlib

import pytest
import torch

import sonicmoe
from conftest import requires_kernel_gpu
from sonicmoe import reference

ANCHORS = {  # (d, n, E, K) of benchmarks/anchors, run at reduced T
    "paper-7b-n256": (1536, 256, 128, 8),
    "paper-7b-n1024": (1536, 1024, 32, 2),
    "paper-30b-n512": (4096, 512, 128, 8),
    "paper-120b-n1024": (4096, 1024, 128, 8),
    "olmoe-1b-7b": (2048, 1024, 64, 8),
    "qwen3-30b-a3b": (2048, 768, 128, 8),
    "qwen3-235b-a22b": (4096, 1536, 128, 8),
    "deepseek-v3": (7168, 2048, 256, 8),
}


def generator(device, *key):
    return torch.Generator(device=device).manual_seed(zlib.crc32(repr(key).encode()))


def make_layer(T, d, n, E, device, gen, dtype=torch.bfloat16):
    x = torch.randn(T, d, generator=gen, device=device).to(dtype)
    router = (torch.randn(E, d, generator=gen, device=device) * d**-0.5).to(dtype)
    w1 = (torch.randn(E, 2 * n, d, generator=gen, device=device) * d**-0.5).to(dtype)
    w2 = (torch.randn(E, d, n, generator=gen, device=device) * n**-0.5).to(dtype)
    return x, router, w1, w2


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def eager_and_compiled(fn, compiled, leaves, grad, call=lambda f, leaves: f(*leaves), may_recompile=True):
    """(name, eager, compiled) for the output and each leaf's gradient of call(f, leaves), f = fn
    and f = compiled, backward from grad; may_recompile=False: the compiled call must reuse a
    graph it has (torch._dynamo's error_on_recompile). Leaves: (x, router, w1, w2)."""
    results = []
    for f in (fn, compiled):
        for t in leaves:
            t.grad = None
        with torch._dynamo.config.patch(error_on_recompile=not may_recompile):
            out = call(f, leaves)
        out.backward(grad)
        results.append([out.detach()] + [t.grad.clone() for t in leaves])
    return zip(("out", "dx", "drouter", "dw1", "dw2"), *results)


def reference_top_k(leaves, experts, routing, g, aux=None, activation="swiglu"):
    """float64 autograd of the reference layer on leaves (x, router, w1, w2) with the given routing
    decisions (T, K), backward from g (plus aux(logits), an auxiliary router loss, where given):
    its output and its leaves, which hold the gradients. activation: the experts' gated one."""
    ref = [t.detach().double().requires_grad_(True) for t in leaves]
    x, router, w1, w2 = ref
    logits = x @ router.t()
    if routing == "softmax_topk":
        scores = logits.softmax(-1).gather(1, experts)
    else:  # topk_softmax and softmax_topk_norm: the softmax over the chosen logits
        scores = logits.gather(1, experts).softmax(-1)
    out = reference.moe_routed(x, w1, w2, scores, experts, activation=activation)
    loss = (out * g.double()).sum() + (aux(logits) if aux is not None else 0)
    loss.backward()
    return out, ref


def router_aux_loss(logits):
    """A load-balancing-like term and a z-loss on the router's logits, as MoE trainers add them,
    summed over the tokens (so that their gradient weighs as much as the output's in a test)."""
    probs = logits.float().softmax(-1)
    cost = torch.linspace(-4.0, 4.0, logits.shape[-1], dtype=probs.dtype, device=probs.device)
    return (probs * cost).sum() + torch.logsumexp(logits.float(), -1).square().sum()


def fp32_reference_forward(x, w1, w2, scores, experts):
    """Per-expert fp32 reference that upcasts one expert at a time (anchor-size weights)."""
    T, d = x.shape
    n = w2.shape[2]
    out = torch.zeros(T, d, device=x.device, dtype=torch.float32)
    for e in torch.unique(experts).tolist():
        t_idx, k_idx = (experts == e).nonzero(as_tuple=True)
        h = x[t_idx].float() @ w1[e].float().t()
        a = torch.nn.functional.silu(h[:, :n]) * h[:, n:]
        out.index_add_(0, t_idx, scores[t_idx, k_idx, None].float() * (a @ w2[e].float().t()))
    return out


# ------------------------------------------------------------------ CPU: API and validation

def test_cpu_tensors_run_the_reference():
    x, router, w1, w2 = make_layer(9, 32, 16, 4, "cpu", generator("cpu", "ref"), torch.float64)
    out = sonicmoe.moe(x, router, w1, w2, 2, routing="softmax_topk_norm")
    torch.testing.assert_close(out, reference.moe(x, router, w1, w2, 2, routing="softmax_topk_norm"))


def test_module_layout_and_shapes():
    layer = sonicmoe.MoE(64, 32, 8, 2, routing="softmax_topk", dtype=torch.float64)
    assert dict((k, tuple(v.shape)) for k, v in layer.state_dict().items()) == {
        "router_weight": (8, 64), "w1": (8, 64, 64), "w2": (8, 64, 32)}
    x = torch.randn(3, 5, 64, dtype=torch.float64, requires_grad=True)
    out = layer(x)
    out.square().sum().backward()
    assert out.shape == x.shape and x.grad.shape == x.shape
    assert all(p.grad is not None for p in layer.parameters())


@pytest.mark.parametrize("call,exc,match", [
    (lambda x, r, w1, w2: sonicmoe.moe(x, r, w1, w2, 2, routing="bogus"), ValueError, "routing: expected one of"),
    (lambda x, r, w1, w2: sonicmoe.moe(x, r, w1, w2, 2, routing="token_rounding", tile=0), ValueError,
     "tile: expected a positive int, got 0"),
    (lambda x, r, w1, w2: sonicmoe.moe(x, r, w1, w2, 0), ValueError, "top_k: expected 1 <= top_k <= E = 4"),
    (lambda x, r, w1, w2: sonicmoe.moe(x, r[:, :8], w1, w2, 2), ValueError, "router_weight: expected shape"),
    (lambda x, r, w1, w2: sonicmoe.moe(x, r, w1[:, :6], w2, 2), ValueError, r"w1: expected shape \(E, 2n, d\)"),
    (lambda x, r, w1, w2: sonicmoe.moe(x, r, w1[:2], w2[:2], 2), ValueError,
     re.escape("w2: expected shape (E, d, n) with (E, d) = (4, 32), got (2, 32, 16)")),
    (lambda x, r, w1, w2: sonicmoe.moe(x, r.double(), w1, w2, 2), ValueError,
     re.escape("router_weight: expected dtype torch.float32 (the dtype of x), got torch.float64")),
    (lambda x, r, w1, w2: sonicmoe.moe_routed(x, w1, w2, torch.ones(3, 2), torch.zeros(9, 2, dtype=torch.long)),
     ValueError, r"scores: expected shape \(T, K\) with T = 9"),
    (lambda x, r, w1, w2: sonicmoe.moe_routed(x, w1, w2, torch.ones(9, 2), torch.zeros(9, 2)),
     ValueError, "experts: expected an integer dtype"),
    (lambda x, r, w1, w2: sonicmoe.moe_routed(x, w1.to("meta"), w2, torch.ones(9, 2),
                                              torch.zeros(9, 2, dtype=torch.long)),
     ValueError, re.escape("x, w1, w2, scores, experts: expected one device, got ['cpu', 'meta']")),
])
def test_validation_errors(call, exc, match):
    x, router, w1, w2 = make_layer(9, 32, 16, 4, "cpu", generator("cpu", "val"), torch.float32)
    with pytest.raises(exc, match=match):
        call(x, router, w1, w2)


@pytest.mark.parametrize("routing", ["topk_softmax", "softmax_topk", "token_rounding"])
def test_router_logits_are_returned_and_their_loss_reaches_x_and_the_router(routing):
    # The CPU reference path: the logits returned are x @ router_weight.T over the flattened
    # tokens, and an auxiliary loss on them adds its gradient to x and router_weight.
    gen = generator("cpu", "logits", routing)
    leaves = [t.requires_grad_(True) for t in make_layer(9, 32, 16, 4, "cpu", gen, torch.float64)]
    x, router, w1, w2 = leaves
    out, logits = sonicmoe.moe(x.view(3, 3, 32), router, w1, w2, 2, routing=routing, tile=4,
                               return_router_logits=True)
    assert out.shape == (3, 3, 32) and torch.equal(logits, torch.nn.functional.linear(x, router))
    (out.sum() + router_aux_loss(logits)).backward()
    plain = [t.detach().clone().requires_grad_(True) for t in leaves]
    (sonicmoe.moe(*plain, 2, routing=routing, tile=4).sum()
     + router_aux_loss(torch.nn.functional.linear(plain[0], plain[1]))).backward()
    for name, got, want in zip(("x", "router", "w1", "w2"), leaves, plain):
        torch.testing.assert_close(got.grad, want.grad, msg=name)
    layer = sonicmoe.MoE(32, 16, 4, 2, dtype=torch.float64, return_router_logits=True)
    out, logits = layer(x.detach())
    assert out.shape == (9, 32) and logits.shape == (9, 4)


def test_autocast_casts_at_the_entry_as_nn_linear_does():
    # fp32 parameters and activations under autocast (the AMP recipe): the layer runs in the
    # autocast dtype, its output is that dtype and every gradient flows back to the fp32 leaves
    # through the casts, the same values as the layer on the cast tensors (here on the CPU's
    # reference path; the GPU tests below check the kernels' path).
    gen = generator("cpu", "autocast")
    fp32 = [t.requires_grad_(True) for t in make_layer(9, 32, 16, 4, "cpu", gen, torch.float32)]
    low = [t.detach().bfloat16().requires_grad_(True) for t in fp32]
    g = torch.randn(9, 32, generator=gen).bfloat16()
    for leaves in (fp32, low):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = sonicmoe.moe(*leaves, 2)
        assert out.dtype == torch.bfloat16
        out.backward(g)
        leaves.append(out)
    for name, got, want in zip(("x", "router", "w1", "w2"), fp32, low):
        assert got.grad.dtype == torch.float32 and torch.equal(got.grad, want.grad.float()), name
    assert torch.equal(fp32[-1], low[-1])


def test_cuda_autocast_must_be_bfloat16(monkeypatch):
    # The kernels are bf16 only: fp16 autocast is refused before anything runs (stand-in tensor:
    # this machine may have no GPU).
    monkeypatch.setattr(torch, "is_autocast_enabled", lambda device_type=None: device_type == "cuda")
    monkeypatch.setattr(torch, "get_autocast_dtype", lambda device_type: torch.float16)
    x = types.SimpleNamespace(device=torch.device("cuda"))
    with pytest.raises(ValueError, match=re.escape("torch.autocast dtype = torch.float16 breaks the rule: "
                                                   "must be torch.bfloat16 on CUDA")):
        sonicmoe.functional._autocast_inputs(x)


def test_the_top_k_kernels_rules():
    # Checked at the layer's entry (no tensor of 2^31 rows is made here): K3 / K8's warp holds 32
    # pairs a token, and the sorted rows are int32.
    check = sonicmoe.functional._check_kernel_top_k
    check("top_k", 32, 2**26 - 1)
    with pytest.raises(ValueError, match=re.escape("top_k = 33 breaks the rule: must be <= 32 on the kernels")):
        check("top_k", 33, 10)
    with pytest.raises(ValueError, match=re.escape("T * top_k = 2147483648 breaks the rule: must be <= 2^31 - 1")):
        check("top_k", 8, 2**28)


def test_a_gpu_this_build_has_no_kernels_for_is_refused_before_any_launch(monkeypatch):
    # The layer runs on Hopper (sm_90a kernels) and Blackwell B200 / GB200 (sm_100a) as built: an
    # A100 (sm_80), a B300 (sm_103) or an RTX 50 (sm_120) is refused by name, and so is the family a
    # build lacks; the others pass (stand-in capabilities: this machine may have no GPU).
    capability = {0: (8, 0), 1: (10, 0), 2: (9, 0), 3: (10, 3), 4: (12, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: capability[index])
    both = "must be Hopper (sm_90: H100, H200) or Blackwell (sm_100: B200, GB200); "
    for archs, why in (((90,), {0: "must be Hopper (sm_90: H100, H200); this build has sm_90a kernels",
                                1: "must be Hopper (sm_90: H100, H200); this build has sm_90a kernels: rebuild with "
                                   'SONICMOE_CUDA_ARCHS="90a;100a"',
                                3: "sm_103 is not sm_100: sm_100a kernels load on compute capability 10.0 only",
                                4: "this build has sm_90a kernels"}),
                       ((90, 100), {0: both + "this build has sm_90a and sm_100a kernels",
                                    3: both + "sm_103 is not sm_100",
                                    4: both + "this build has sm_90a and sm_100a kernels"})):
        monkeypatch.setattr(sonicmoe._ops, "kernel_archs", lambda archs=archs: archs)
        monkeypatch.setattr(sonicmoe.functional, "_device_families", {})
        for index, reason in why.items():
            sm = "sm_" + "".join(map(str, capability[index]))
            with pytest.raises(ValueError, match=re.escape(f"x.device = cuda:{index} ({sm}) breaks the rule: ") +
                               ".*" + re.escape(reason)):
                sonicmoe.functional._check_kernel_device(torch.device("cuda", index))
        passing = {2: 90} if archs == (90,) else {1: 100, 2: 90}
        for index in passing:
            sonicmoe.functional._check_kernel_device(torch.device("cuda", index))
        assert sonicmoe.functional._device_families == passing


# ------------------------------------------------------------------ GPU

def check_routed(T, d, n, E, K, key, experts=None, grads=True, activation="swiglu"):
    gen = generator("cuda", *key)
    x, router, w1, w2 = make_layer(T, d, n, E, "cuda", gen)
    logits = (x.float() @ router.float().t())
    scores, chosen = sonicmoe.routing.scores_from_logits(logits, K, "softmax_topk_norm")
    experts = chosen if experts is None else experts
    leaves = [t.clone().requires_grad_(grads) for t in (x, w1, w2, scores)]
    torch.full((T * d,), float("nan"), device="cuda", dtype=torch.bfloat16)  # poison the pool
    out = sonicmoe.moe_routed(*leaves, experts, activation=activation)
    ref_leaves = [t.detach().double().requires_grad_(grads) for t in (x, w1, w2, scores)]
    ref = reference.moe_routed(*ref_leaves, experts, activation=activation)
    assert out.shape == (T, d) and torch.isfinite(out).all()
    if T:
        assert rel(out, ref) <= 1e-2
    if grads and T:
        g = torch.randn(T, d, device="cuda", generator=gen)
        out.backward(g.to(out.dtype))
        ref.backward(g.double())
        for name, mine, theirs in zip(("x", "w1", "w2", "scores"), leaves, ref_leaves):
            assert torch.isfinite(mine.grad).all(), name
            assert rel(mine.grad, theirs.grad) <= 1e-2, f"grad {name}: {rel(mine.grad, theirs.grad):.3e}"


@requires_kernel_gpu
@pytest.mark.parametrize("T", [0, 1, 7, 1000])
@pytest.mark.parametrize("E,K", [(1, 1), (8, 2), (128, 8), (256, 16)])
def test_moe_routed_forward_backward(T, E, K):
    check_routed(T, 256, 128, E, K, ("routed", T, E, K))


@requires_kernel_gpu
@pytest.mark.parametrize("activation", ["geglu", "reglu"])
@pytest.mark.parametrize("T,d,n,E,K", [(1000, 256, 128, 8, 2), (7, 256, 128, 128, 8), (600, 512, 1024, 16, 4),
                                       (300, 72, 40, 4, 2)])
def test_moe_routed_forward_backward_other_activations(T, d, n, E, K, activation):
    # GeGLU and ReGLU in K1's and K4's epilogues against float64 autograd of the reference, with
    # SwiGLU's tolerances; n 1024 takes the tail beside K5 / K7, n 40 a partial H block.
    check_routed(T, d, n, E, K, ("routed-act", T, d, n, E, K, activation), activation=activation)


@requires_kernel_gpu
@pytest.mark.parametrize("activation", ["geglu", "reglu"])
@pytest.mark.parametrize("routing", ["softmax_topk", "softmax_topk_norm", "token_rounding"])
def test_every_gradient_of_the_layer_other_activations(routing, activation):
    # sonicmoe.moe with GeGLU / ReGLU experts: _MoELayer (softmax_topk: the dense router GEMM;
    # softmax_topk_norm: the router's part of dx in K6) and token rounding's _MoEDenseExperts,
    # forward and every gradient against float64 autograd of the reference, the layer's routing.
    gen = generator("cuda", "layer-grads-act", routing, activation)
    T, K = 300, 2
    leaves = [t.requires_grad_(True) for t in make_layer(T, 128, 64, 8, "cuda", gen)]
    x, router, w1, w2 = leaves
    opts = dict(tile=16) if routing == "token_rounding" else {}
    out = sonicmoe.moe(x, router, w1, w2, K, routing=routing, activation=activation, **opts)
    g = torch.randn(out.shape, device="cuda", generator=gen)
    (out.float() * g).sum().backward()
    ref = [t.detach().double().requires_grad_(True) for t in leaves]
    if routing == "token_rounding":
        with torch.no_grad():  # the layer's own assignment
            _, _, assigned_t = sonicmoe.routing.token_rounding_expert_major(
                torch.nn.functional.linear(x, router), K, 16, "nearest", fp32_probs=True)
        rx, rrouter, rw1, rw2 = ref
        assigned = assigned_t.t()
        ref_out = reference.moe_dense_routed(rx, rw1, rw2, (rx @ rrouter.t()).softmax(-1) * assigned, assigned,
                                             activation=activation)
        ref_out.backward(g.double())
    else:
        with torch.no_grad():
            experts = sonicmoe.router_topk(torch.nn.functional.linear(x, router), K, routing)[1].long()
        ref_out, ref = reference_top_k(leaves, experts, routing, g, activation=activation)
    assert rel(out, ref_out.detach()) <= 1e-2
    for name, got, want in zip(("dx", "drouter", "dw1", "dw2"), leaves, ref):
        assert torch.isfinite(got.grad).all(), name
        assert rel(got.grad, want.grad) <= 2e-2, f"{name}: {rel(got.grad, want.grad):.3e}"


@requires_kernel_gpu
def test_more_experts_than_the_routing_kernels_take_on_the_gpu():
    # Past R's ROUTER_MAX_EXPERTS the sorted layout is built by torch ops (routing_metadata); the
    # expert kernels have no such limit (most of the 1032 experts get no row here).
    check_routed(300, 128, 64, sonicmoe._ops.ROUTER_MAX_EXPERTS + 8, 4, ("routed-many-experts",))


@requires_kernel_gpu
def test_skewed_routing_hot_expert_and_empty_ones():
    T, E, K = 600, 16, 2
    experts = torch.zeros(T, K, dtype=torch.long, device="cuda")
    experts[:, 1] = 1 + (torch.arange(T, device="cuda") % 3)  # experts 4..15 get nothing
    check_routed(T, 128, 64, E, K, ("skewed",), experts=experts)


@requires_kernel_gpu
@pytest.mark.parametrize("repeat", range(3))
def test_idle_experts_get_exactly_zero_weight_gradients_on_recycled_memory(repeat):
    # The weight gradients come from torch._grouped_mm with no zeroing pass: an empty group must
    # be written as zeros. Freed NaN blocks of the gradients' size make the caching allocator
    # hand the backward recycled memory, so an unwritten expert would show NaN here.
    T, d, n, E, K = 300, 256, 128, 16, 2
    gen = generator("cuda", "idle", repeat)
    x, _, w1, w2 = make_layer(T, d, n, E, "cuda", gen)
    w1.requires_grad_()
    w2.requires_grad_()
    experts = torch.stack([torch.zeros(T, dtype=torch.long, device="cuda"),
                           1 + torch.arange(T, device="cuda") % 5], dim=1)  # experts 6..15 idle
    scores = torch.rand(T, K, device="cuda", generator=gen).softmax(-1)
    for _ in range(2):
        poison = [torch.full_like(w, float("nan")) for w in (w1, w2) for _ in range(4)]
        del poison
        w1.grad = w2.grad = None
        sonicmoe.moe_routed(x, w1, w2, scores, experts).backward(torch.randn(T, d, device="cuda").bfloat16())
        assert (w1.grad[6:] == 0).all() and (w2.grad[6:] == 0).all()
        assert torch.isfinite(w1.grad[:6]).all() and torch.isfinite(w2.grad[:6]).all()


@requires_kernel_gpu
@pytest.mark.parametrize("name", list(ANCHORS))
def test_anchor_configs_forward_at_reduced_T(name):
    d, n, E, K = ANCHORS[name]
    gen = generator("cuda", "anchor", name)
    x, router, w1, w2 = make_layer(256, d, n, E, "cuda", gen)
    scores, experts = sonicmoe.routing.scores_from_logits(x.float() @ router.float().t(), K, "topk_softmax")
    out = sonicmoe.moe_routed(x, w1, w2, scores, experts)
    assert rel(out, fp32_reference_forward(x, w1, w2, scores, experts)) <= 1e-2


@requires_kernel_gpu
@pytest.mark.parametrize("routing", reference.ROUTING_MODES)
def test_moe_every_routing_mode(routing):
    gen = generator("cuda", "moe", routing)
    x, router, w1, w2 = make_layer(512, 256, 128, 32, "cuda", gen)
    x = x.view(4, 128, 256)
    out = sonicmoe.moe(x, router, w1, w2, 4, routing=routing)
    # Same routing decisions as the layer (fp32 softmax/top-K of the bf16 logits).
    logits = torch.nn.functional.linear(x.view(-1, 256), router).float()
    scores, experts = sonicmoe.routing.scores_from_logits(logits, 4, routing)
    ref = fp32_reference_forward(x.view(-1, 256), w1, w2, scores, experts)
    assert out.shape == x.shape and rel(out.view(-1, 256), ref) <= 1e-2


@requires_kernel_gpu
def test_router_weight_receives_gradient():
    gen = generator("cuda", "router-grad")
    x, router, w1, w2 = make_layer(300, 128, 64, 8, "cuda", gen)
    router.requires_grad_(True)
    out = sonicmoe.moe(x, router, w1, w2, 2)
    g = torch.randn(out.shape, device="cuda", generator=gen)
    out.backward(g.to(out.dtype))
    # Reference in float64 with the layer's routing decisions (topk_softmax over its experts).
    experts = torch.nn.functional.linear(x, router.detach()).float().topk(2, dim=-1).indices
    ref_router = router.detach().double().requires_grad_(True)
    logits = x.double() @ ref_router.t()
    scores = logits.gather(1, experts).softmax(-1)
    ref = reference.moe_routed(x.double(), w1.double(), w2.double(), scores, experts)
    ref.backward(g.double())
    assert rel(router.grad, ref_router.grad) <= 2e-2


@requires_kernel_gpu
@pytest.mark.parametrize("routing", ["topk_softmax", "softmax_topk", "softmax_topk_norm"])
@pytest.mark.parametrize("aux", [False, True])
def test_every_gradient_of_the_layer(routing, aux):
    # dx is the experts' part (K8) plus the router's (added inside the router's GEMM by
    # _MoELayer); both against float64 autograd of the reference with the layer's own routing
    # decisions (R's kernel on the same bf16 logits). aux: the layer also returns its logits and
    # an auxiliary loss on them joins R's d_logits inside the layer's backward.
    gen = generator("cuda", "layer-grads", routing, aux)
    leaves = [t.requires_grad_(True) for t in make_layer(300, 128, 64, 8, "cuda", gen)]
    x, router, w1, w2 = leaves
    out = sonicmoe.moe(x, router, w1, w2, 2, routing=routing, return_router_logits=aux)
    if aux:
        out, logits = out
        assert torch.equal(logits, torch.nn.functional.linear(x, router))
    g = torch.randn(out.shape, device="cuda", generator=gen)
    ((out.float() * g).sum() + (router_aux_loss(logits) if aux else 0)).backward()
    with torch.no_grad():
        experts = sonicmoe.router_topk(torch.nn.functional.linear(x, router), 2, routing)[1].long()
    _, ref_leaves = reference_top_k(leaves, experts, routing, g, aux=router_aux_loss if aux else None)
    for name, got, want in zip(("dx", "drouter", "dw1", "dw2"), leaves, ref_leaves):
        assert rel(got.grad, want.grad) <= 2e-2, name


@requires_kernel_gpu
@pytest.mark.parametrize("routing", ["topk_softmax", "softmax_topk_norm"])
@pytest.mark.parametrize("n", [128, 512])
def test_router_dx_in_k6_against_the_dense_router_gemm(routing, n):
    # The router's part of dx added in K6's epilogue against the dense d_logits @ router_weight added
    # in K8 (the form the layer takes where the logits are returned: unused, their gradient is
    # zeros): the weight and router gradients are the same bits (the same d_logits, the same
    # kernels), dx the same sum rounded elsewhere. n 512 runs the tail beside K5 / K7, n 128 after.
    gen = generator("cuda", "router-dx-in-k6", routing, n)
    leaves = [t.requires_grad_(True) for t in make_layer(700, 256, n, 16, "cuda", gen)]
    g = torch.randn(700, 256, device="cuda", generator=gen).bfloat16()

    def grads(logits_returned):
        for t in leaves:
            t.grad = None
        out = sonicmoe.moe(*leaves, 4, routing=routing, return_router_logits=logits_returned)
        (out[0] if logits_returned else out).backward(g)
        return [t.grad.clone() for t in leaves]

    got, want = grads(False), grads(True)
    assert torch.isfinite(got[0]).all()
    assert rel(got[0], want[0].float()) <= 4e-3
    for name, a, b in zip(("drouter", "dw1", "dw2"), got[1:], want[1:]):
        assert torch.equal(a, b), name


def test_tail_runs_beside_the_weight_gradients_only_in_eager_cuda_top_k_at_n_512_to_1024():
    beside = sonicmoe.functional._tail_beside_weight_grads
    assert not beside(torch.zeros(1), 512, False)  # CPU tensors (the emulated kernels)
    assert not beside(torch.zeros(1, device="meta"), 512, False)
    if torch.cuda.is_available():
        x = torch.zeros(1, device="cuda")
        assert beside(x, 512, False) and beside(x, 768, False) and beside(x, 1024, False)
        # measured no faster there (docs/performance.md)
        assert not beside(x, 256, False) and not beside(x, 1536, False) and not beside(x, 2048, False)
        assert not beside(x, 512, True)  # token rounding's layout: not measured


@requires_kernel_gpu
@pytest.mark.parametrize("layer", ["moe", "moe_routed"])
@pytest.mark.parametrize("needs", ["all", "weights", "x_and_router"])
def test_tail_beside_the_weight_gradients_gives_the_same_bits(monkeypatch, layer, needs):
    # Where 512 <= n <= 1024 the backward's tail (K8 and the router's part) runs on a second stream
    # while K5 / K7 leave it SMs (functional._TAIL_SM_MARGIN); here at n 128 with the rule answering
    # yes, then no, so both orders run: every gradient must be bit-identical (each is one
    # deterministic kernel either way).
    F = sonicmoe.functional
    gen = generator("cuda", "tail-beside", layer, needs)
    T, d, n, E, K = 700, 256, 128, 16, 4
    x, router, w1, w2 = make_layer(T, d, n, E, "cuda", gen)
    want = {"all": (True, True, True, True), "weights": (False, False, True, True),
            "x_and_router": (True, True, False, False)}[needs]
    g = torch.randn(T, d, device="cuda", generator=gen).bfloat16()
    streams_made = []
    side_streams = F._side_streams
    monkeypatch.setattr(F, "_side_streams", lambda device: streams_made.append(device) or side_streams(device))
    grads = {}
    rule = F._tail_beside_weight_grads
    for beside in (True, False):
        monkeypatch.setattr(F, "_tail_beside_weight_grads", lambda x, n, partial_rows, _b=beside: _b and rule(x, 512, partial_rows))
        leaves = [t.clone().requires_grad_(r) for t, r in zip((x, router, w1, w2), want)]
        if layer == "moe":
            out = sonicmoe.moe(*leaves, K)
        else:
            scores, experts = sonicmoe.router_topk(torch.nn.functional.linear(x, router), K, "topk_softmax")
            leaves[1] = scores.clone().requires_grad_(want[1])
            out = sonicmoe.moe_routed(leaves[0], leaves[2], leaves[3], leaves[1], experts)
        torch.full((T * d * 8,), float("nan"), device="cuda", dtype=torch.bfloat16)  # poison the pool
        out.backward(g)
        grads[beside] = [t.grad for t in leaves]
    assert len(streams_made) == (1 if want[2] else 0)  # beside only with weight gradients to run
    for name, got, ref in zip(("x", "router or scores", "w1", "w2"), grads[True], grads[False]):
        assert (got is None) == (ref is None), name
        if ref is not None:
            assert torch.isfinite(ref).all() and torch.equal(got, ref), name


@requires_kernel_gpu
@pytest.mark.parametrize("entry", ["moe", "token_rounding", "moe_routed", "module"])
def test_autocast_runs_fp32_parameters_with_the_bf16_layers_bits(entry):
    # The AMP recipe: fp32 parameters and an fp32 residual stream under autocast(bfloat16). The
    # layer casts at its entry (as nn.Linear does), so its output is the bf16 layer's, bit for bit,
    # and each fp32 gradient is the bf16 layer's gradient cast (deterministic kernels).
    gen = generator("cuda", "autocast", entry)
    T, d, n, E, K = 300, 256, 128, 16, 2
    x, router, w1, w2 = make_layer(T, d, n, E, "cuda", gen)
    g = torch.randn(T, d, device="cuda", generator=gen).bfloat16()
    scores, experts = sonicmoe.router_topk(torch.nn.functional.linear(x, router), K, "topk_softmax")
    results = []
    for dtype in (torch.float32, torch.bfloat16):
        if entry == "module":
            layer = sonicmoe.MoE(d, n, E, K, device="cuda", dtype=dtype)
            with torch.no_grad():
                for p, t in zip((layer.router_weight, layer.w1, layer.w2), (router, w1, w2)):
                    p.copy_(t)
            leaves = [x.to(dtype).requires_grad_(True), layer.router_weight, layer.w1, layer.w2]
        else:
            leaves = [t.to(dtype).requires_grad_(True) for t in (x, router, w1, w2)]
            if entry == "moe_routed":
                leaves[1] = scores.clone().requires_grad_(True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            if entry == "module":
                out = layer(leaves[0])
            elif entry == "moe_routed":
                out = sonicmoe.moe_routed(leaves[0], leaves[2], leaves[3], leaves[1], experts)
            else:
                out = sonicmoe.moe(*leaves, K, routing="token_rounding" if entry == "token_rounding" else "topk_softmax")
        assert out.dtype == torch.bfloat16
        out.backward(g)
        results.append((out.detach(), [t.grad for t in leaves], [t.dtype for t in leaves]))
    (out32, grads32, dtypes32), (out16, grads16, _) = results
    assert torch.isfinite(out16).all() and torch.equal(out32, out16)
    for name, got, want, dtype in zip(("x", "router or scores", "w1", "w2"), grads32, grads16, dtypes32):
        assert got.dtype == dtype and torch.isfinite(want).all() and torch.equal(got, want.to(dtype)), name


@requires_kernel_gpu
def test_autocast_float16_and_fp32_weights_outside_autocast_are_refused():
    gen = generator("cuda", "autocast-refused")
    x, router, w1, w2 = make_layer(64, 128, 64, 8, "cuda", gen)
    with torch.autocast("cuda", dtype=torch.float16), pytest.raises(
            ValueError, match=re.escape("torch.autocast dtype = torch.float16 breaks the rule")):
        sonicmoe.moe(x, router, w1, w2, 2)
    with pytest.raises(ValueError, match=re.escape("w1.dtype = torch.float32 breaks the rule: must be torch.bfloat16 "
                                                   "on CUDA")) as error:
        sonicmoe.moe_routed(x, w1.float(), w2, torch.ones(64, 2, device="cuda"),
                            torch.zeros(64, 2, device="cuda", dtype=torch.long))
    assert "torch.autocast('cuda', dtype=torch.bfloat16)" in str(error.value)


@requires_kernel_gpu
@pytest.mark.parametrize("entry", ["moe", "moe_routed"])
@pytest.mark.parametrize("view", ["transposed", "misaligned"])
def test_strided_or_misaligned_x_gives_the_contiguous_bits(entry, view):
    # x as a transposed view or at a storage offset that is not 16-byte aligned (a sliced
    # activation): the layer reads a copy where the kernels need one; same bits, and x's gradient
    # reaches the view's base.
    gen = generator("cuda", "strided-x", entry, view)
    T, d, n, E, K = 300, 256, 128, 16, 2
    x, router, w1, w2 = make_layer(T, d, n, E, "cuda", gen)
    g = torch.randn(T, d, device="cuda", generator=gen).bfloat16()
    scores, experts = sonicmoe.router_topk(torch.nn.functional.linear(x, router), K, "topk_softmax")

    def run(base, as_x):
        leaves = [t.clone().requires_grad_(True) for t in (router, w1, w2)]
        xs = as_x(base)
        if entry == "moe":
            out = sonicmoe.moe(xs, *leaves, K)
        else:
            leaves[0] = scores.clone().requires_grad_(True)
            out = sonicmoe.moe_routed(xs, leaves[1], leaves[2], leaves[0], experts)
        out.backward(g)
        return out, [base.grad] + [t.grad for t in leaves]

    if view == "transposed":
        base = x.t().contiguous().requires_grad_(True)
        as_x, x_grad_of = (lambda b: b.t()), (lambda grad: grad.t())
    else:
        base = torch.cat([x.new_zeros(1), x.flatten()]).requires_grad_(True)
        as_x, x_grad_of = (lambda b: b[1:].view(T, d)), (lambda grad: grad[1:].view(T, d))
        assert as_x(base).data_ptr() % 16
    out, grads = run(base, as_x)
    want_out, want_grads = run(x.clone().requires_grad_(True), lambda b: b)
    assert torch.equal(out, want_out)
    grads[0] = x_grad_of(grads[0])
    for name, got, want in zip(("x", "router or scores", "w1", "w2"), grads, want_grads):
        assert torch.isfinite(want).all() and torch.equal(got, want), name


@requires_kernel_gpu
@pytest.mark.parametrize("d", [256, 4096])  # d 4096: K1 on the clustered tile (a cluster launch)
def test_no_grad_keeps_nothing_and_forward_captures_in_a_cuda_graph(d):
    gen = generator("cuda", "graph", d)
    x, router, w1, w2 = make_layer(1024, d, 128, 16, "cuda", gen)
    with torch.no_grad():
        out = sonicmoe.moe(x, router, w1, w2, 2)
        assert out.grad_fn is None
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = sonicmoe.moe(x, router, w1, w2, 2)
        x.copy_(torch.randn(x.shape, device="cuda", generator=gen).bfloat16())
        graph.replay()
        torch.cuda.synchronize()
        expected = sonicmoe.moe(x, router, w1, w2, 2)
    assert torch.equal(captured, expected)  # deterministic kernels, same routing


def training_step_leaves(routing, key):
    """(step, leaves, grad) for a training step of the layer at n 512 (where the eager top-K
    backward runs its tail on a second stream), backward from grad into the leaves' .grad."""
    gen = generator("cuda", *key)
    T, d, n, E, K = 384, 256, 512, 16, 2
    leaves = [t.requires_grad_(True) for t in make_layer(T, d, n, E, "cuda", gen)]
    grad = torch.randn(T, d, device="cuda", generator=gen).bfloat16()

    def step(layer=sonicmoe.moe):
        for t in leaves:
            t.grad = None
        out = layer(*leaves, K, routing=routing, tile=64)
        out.backward(grad)
        return out

    return step, leaves, grad


@requires_kernel_gpu
@pytest.mark.parametrize("routing", ["topk_softmax", "token_rounding"])
def test_training_step_captures_in_a_cuda_graph(routing):
    # docs/design.md §4: no host sync in forward or backward, so a whole training step (forward, backward,
    # the gradients; the tail's second stream included) captures in one CUDA graph. Replayed on
    # new x, it gives eager's bits on that x.
    step, leaves, grad = training_step_leaves(routing, ("graph-step", routing))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, as torch.cuda.graph asks
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    new_x = torch.randn(leaves[0].shape, device="cuda", generator=generator("cuda", "new-x", routing)).bfloat16()
    with torch.no_grad():
        leaves[0].copy_(new_x)
    graph.replay()
    torch.cuda.synchronize()
    got = [captured.detach().clone()] + [t.grad.clone() for t in leaves]
    del captured  # its graph holds the leaves' AccumulateGrad nodes of the capture stream
    want_out = step()
    want = [want_out.detach()] + [t.grad for t in leaves]
    for name, a, b in zip(("out", "dx", "drouter", "dw1", "dw2"), got, want):
        assert torch.isfinite(b).all() and torch.equal(a, b), name


@requires_kernel_gpu
@pytest.mark.parametrize("routing", ["topk_softmax", "token_rounding"])
def test_activation_checkpointing_gives_the_same_gradients(routing):
    # torch.utils.checkpoint (non-reentrant) drops what the layer saves and runs its forward again
    # in backward: the same routing and H, so the same gradients, bit for bit.
    step, leaves, grad = training_step_leaves(routing, ("checkpoint", routing))
    want = [step().detach()] + [t.grad for t in leaves]

    def checkpointed(*args, **kwargs):
        return torch.utils.checkpoint.checkpoint(sonicmoe.moe, *args, use_reentrant=False, **kwargs)

    got = [step(checkpointed).detach()] + [t.grad for t in leaves]
    for name, a, b in zip(("out", "dx", "drouter", "dw1", "dw2"), got, want):
        assert torch.isfinite(b).all() and torch.equal(a, b), name


# Ops that copy or gather a tensor: in the forward none may read w1 (a weight copy) or x (a
# gathered copy of x); the kernels read both in place.
COPYING_OPS = ("aten::copy_", "aten::clone", "aten::_to_copy", "aten::contiguous", "aten::index",
               "aten::index_select", "aten::gather", "aten::take", "aten::repeat_interleave",
               "aten::cat", "aten::stack")


@requires_kernel_gpu
@pytest.mark.parametrize("d, n", [(256, 128), (4096, 256)])  # d 4096: K1 on the clustered tile
def test_training_forward_copies_neither_w1_nor_x(d, n):
    # Issue 3: the profiler's op list of one training forward shows no copy of w1 and no gathered
    # copy of x (record_shapes gives each op's input shapes).
    gen = generator("cuda", "no-copies", d)
    T, E, K = 512, 8, 2
    x, router, w1, w2 = make_layer(T, d, n, E, "cuda", gen)
    for t in (x, router, w1, w2):
        t.requires_grad_(True)
    sonicmoe.moe(x, router, w1, w2, K)  # warm-up: module loads, descriptor encoder
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
        sonicmoe.moe(x, router, w1, w2, K)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events()]
    assert any("sonicmoe::up_proj" in s for s in names), sorted(set(names))
    for shape, what in ((list(w1.shape), "w1"), (list(x.shape), "x")):
        copies = [(e.name, e.input_shapes) for e in prof.events() if e.name in COPYING_OPS and shape in e.input_shapes]
        assert not copies, f"the forward copies {what}: {copies}"


@requires_kernel_gpu
def test_no_grad_with_trainable_weights_writes_no_h():
    # Parameters that require grad under torch.no_grad (evaluation of a training model): no
    # graph is built, so the forward must not write H (T*K x 2n, the largest buffer here).
    gen = generator("cuda", "no-h")
    T, d, n, E, K = 1024, 256, 1024, 16, 2
    x, router, w1, w2 = make_layer(T, d, n, E, "cuda", gen)
    for t in (router, w1, w2):
        t.requires_grad_(True)
    h_bytes = T * K * 2 * n * 2
    with torch.no_grad():
        sonicmoe.moe(x, router, w1, w2, K)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        sonicmoe.moe(x, router, w1, w2, K)
        torch.cuda.synchronize()
        assert torch.cuda.max_memory_allocated() - before < h_bytes


@requires_kernel_gpu
def test_backward_saves_only_x_h_scores_and_metadata():
    # docs/design.md §3: besides the caller's own tensors (x and the parameters), the layer keeps H, the
    # scores and int32 routing metadata for backward, nothing else (no A, no Y, no logits).
    gen = generator("cuda", "saved")
    T, d, n, E, K = 512, 256, 128, 16, 4
    x, router, w1, w2 = make_layer(T, d, n, E, "cuda", gen)
    for t in (x, router, w1, w2):
        t.requires_grad_(True)
    own = {t.data_ptr() for t in (x, router, w1, w2)}
    saved = []

    def pack(t):
        if t.data_ptr() not in own:
            saved.append((tuple(t.shape), t.dtype, t.data_ptr(), t.numel() * t.element_size()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = sonicmoe.moe(x, router, w1, w2, K)
    distinct = {ptr: (shape, dtype, size) for shape, dtype, ptr, size in saved}
    print("saved beyond x and the parameters:")
    for shape, dtype, size in distinct.values():
        print(f"  {str(shape):<16} {str(dtype):<16} {size} bytes")
    M = T * K
    expected = sorted([((M, 2 * n), torch.bfloat16),       # H
                       ((T, K), torch.float32),            # scores
                       ((T, K), torch.int32),              # expert ids
                       ((E + 1,), torch.int32),            # expert_offsets
                       ((M,), torch.int32),                # gather_idx
                       ((T, K), torch.int32)], key=str)    # rev_idx
    assert sorted(((s, dt) for s, dt, _ in distinct.values()), key=str) == expected
    out.float().sum().backward()
    assert all(t.grad is not None for t in (x, router, w1, w2))


@requires_kernel_gpu
@pytest.mark.parametrize("routing", ["topk_softmax", "token_rounding"])
@pytest.mark.parametrize("activation", ["swiglu", "geglu"])
def test_torch_compile_fullgraph_forward_and_backward(routing, activation):
    # The layer traces into one graph (no host sync, every op has a fake) and its compiled
    # forward and backward match eager, in both layer paths (token rounding's dense one too:
    # there Inductor once gave every score gradient to the next expert), the activation a
    # constant of the graph.
    gen = generator("cuda", "compile", routing)
    T, d, n, E, K = 512, 256, 128, 16, 2
    leaves = [t.requires_grad_(True) for t in make_layer(T, d, n, E, "cuda", gen)]
    grad = torch.randn(T, d, device="cuda", generator=gen).bfloat16()
    # Token rounding ranks tokens by their softmax probabilities, and Inductor's softmax may
    # differ from eager's in the last bit, which can swap two near-tied tokens at an expert's
    # rounding boundary (a different, equally valid assignment). Rounding up to tile = T gives
    # every chosen expert all T tokens: no ranking, the same assignment in both runs.
    opts = dict(tile=T, rule="up") if routing == "token_rounding" else dict(tile=64)

    def layer(x, router, w1, w2):
        return sonicmoe.moe(x, router, w1, w2, K, routing=routing, activation=activation, **opts)

    for name, eager, comp in eager_and_compiled(layer, torch.compile(layer, fullgraph=True), leaves, grad):
        assert rel(comp, eager) <= 1e-2, name


@requires_kernel_gpu
def test_torch_compile_fullgraph_under_autocast_with_fp32_parameters():
    # The entry's casts trace too: the compiled layer under autocast(bfloat16) with fp32 leaves
    # matches eager's, output and fp32 gradients.
    gen = generator("cuda", "compile-autocast")
    T, d, n, E, K = 512, 256, 128, 16, 2
    leaves = [t.float().requires_grad_(True) for t in make_layer(T, d, n, E, "cuda", gen)]
    grad = torch.randn(T, d, device="cuda", generator=gen).bfloat16()

    def layer(x, router, w1, w2):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return sonicmoe.moe(x, router, w1, w2, K)

    for name, eager, comp in eager_and_compiled(layer, torch.compile(layer, fullgraph=True), leaves, grad):
        assert comp.dtype == eager.dtype == (torch.bfloat16 if name == "out" else torch.float32), name
        assert rel(comp, eager) <= 1e-2, name


@requires_kernel_gpu
@pytest.mark.parametrize("routing", ["topk_softmax", "token_rounding"])
def test_torch_compile_dynamic_tokens_one_graph(routing):
    # One graph for every token count (T dynamic: nothing specialises on it; token rounding's
    # row bound reaches dense_layout as a SymInt), and it matches eager at each. Token rounding
    # rounds up to tile = 1024 >= T: every chosen expert takes all T tokens, no ranking (see above).
    # Only T is marked dynamic, as a trainer's varying batch is: dynamic=True would make E dynamic
    # too (the weights are graph inputs here), and Inductor then builds the router's softmax
    # backward as a persistent reduction of 1024 columns at XBLOCK 128 on 2 warps (configs picked
    # for E's hint, 16), which ptxas did not finish in 100 s on the H200.
    d, n, E, K = 256, 128, 16, 2
    opts = dict(tile=1024, rule="up") if routing == "token_rounding" else {}

    def layer(x, router, w1, w2):
        return sonicmoe.moe(x, router, w1, w2, K, routing=routing, **opts)

    compiled = torch.compile(layer, fullgraph=True)
    try:
        for i, T in enumerate((512, 640, 1000)):
            gen = generator("cuda", "compile-dynamic", routing, T)
            leaves = [t.requires_grad_(True) for t in make_layer(T, d, n, E, "cuda", gen)]
            torch._dynamo.mark_dynamic(leaves[0], 0)
            grad = torch.randn(T, d, device="cuda", generator=gen).bfloat16()
            for name, eager, comp in eager_and_compiled(layer, compiled, leaves, grad, may_recompile=i == 0):
                assert rel(comp, eager) <= 1e-2, (T, name)
    finally:
        torch._dynamo.reset()
