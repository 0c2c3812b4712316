"""The layer's kernel path on the CPU: sonicmoe.moe / moe_routed with every op emulated for CPU
tensors (kernel_emulation.py), against sonicmoe.reference in float64 with the layer's own routing
decisions. This runs where CI runs (no GPU): the autograd Functions of sonicmoe.functional, the
metadata and buffers they pass between ops (token rounding's upper-bound ones included), what
they save for backward and the ops' fakes under torch.compile. The kernels themselves are tested
against the same reference on the GPU (test_moe.py and the per-kernel tests)."""

import re
import weakref

import pytest
import torch
import torch.nn.functional as F

import sonicmoe
from conftest import requires_extension
from kernel_emulation import emulated_kernels
from sonicmoe import reference
from sonicmoe.routing import token_rounding_expert_major
from test_moe import eager_and_compiled, generator, make_layer, reference_top_k, rel, router_aux_loss

pytestmark = requires_extension

TOP_K_MODES = ["topk_softmax", "softmax_topk", "softmax_topk_norm"]
ACTIVATIONS = list(sonicmoe.GLU_ACTIVATIONS)


@pytest.fixture
def kernels():
    with emulated_kernels():
        yield


def layer_leaves(T, d, n, E, *key):
    return [t.requires_grad_(True) for t in make_layer(T, d, n, E, "cpu", generator("cpu", *key))]


def made_by(out, function):
    """Whether out comes from the autograd Function named function (through the output's view)."""
    node = out.grad_fn
    while node is not None and function not in type(node).__name__:
        node = node.next_functions[0][0] if node.next_functions else None
    return node is not None


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("routing", TOP_K_MODES)
def test_every_gradient_of_the_top_k_layer(kernels, monkeypatch, routing, activation):
    leaves = layer_leaves(300, 128, 64, 8, "emulated-layer", routing)
    x, router, w1, w2 = leaves
    calls = []  # the activation each of K1 and K4 is given
    for name in ("up_proj", "down_proj_grad"):
        def spy(*args, _name=name, _real=getattr(sonicmoe.functional, name), **kwargs):
            calls.append((_name, kwargs.get("activation")))
            return _real(*args, **kwargs)
        monkeypatch.setattr(sonicmoe.functional, name, spy)
    out = sonicmoe.moe(x, router, w1, w2, 2, routing=routing, activation=activation)
    assert made_by(out, "_MoELayer")  # the kernel path, not the reference
    g = torch.randn(out.shape, generator=generator("cpu", "g", routing))
    out.backward(g.to(out.dtype))
    assert calls == [("up_proj", activation), ("down_proj_grad", activation)]
    with torch.no_grad():
        experts = sonicmoe.router_topk(F.linear(x, router), 2, routing)[1].long()
    ref_out, ref = reference_top_k(leaves, experts, routing, g, activation=activation)
    assert rel(out.detach(), ref_out.detach()) <= 1e-2
    for name, got, want in zip(("dx", "drouter", "dw1", "dw2"), leaves, ref):
        assert torch.isfinite(got.grad).all(), name
        assert rel(got.grad, want.grad) <= 2e-2, f"{name}: {rel(got.grad, want.grad):.3e}"


@pytest.mark.parametrize("routing", TOP_K_MODES)
def test_router_logits_loss_joins_the_layers_gradients(kernels, routing):
    # return_router_logits on _MoELayer: the logits' own gradient (an auxiliary loss) joins R's
    # d_logits in the Function's backward, before the router's GEMMs; the output is the layer's.
    leaves = layer_leaves(300, 128, 64, 8, "emulated-logits", routing)
    x, router, w1, w2 = leaves
    out, logits = sonicmoe.moe(x, router, w1, w2, 2, routing=routing, return_router_logits=True)
    assert made_by(out, "_MoELayer") and torch.equal(logits, F.linear(x, router))
    assert torch.equal(out, sonicmoe.moe(x, router, w1, w2, 2, routing=routing))
    g = torch.randn(out.shape, generator=generator("cpu", "g-logits", routing))
    ((out.float() * g).sum() + router_aux_loss(logits)).backward()
    with torch.no_grad():
        experts = sonicmoe.router_topk(F.linear(x, router), 2, routing)[1].long()
    _, ref = reference_top_k(leaves, experts, routing, g, aux=router_aux_loss)
    for name, got, want in zip(("dx", "drouter", "dw1", "dw2"), leaves, ref):
        assert torch.isfinite(got.grad).all(), name
        assert rel(got.grad, want.grad) <= 2e-2, f"{name}: {rel(got.grad, want.grad):.3e}"


@pytest.mark.parametrize("aux", [False, True])
@pytest.mark.parametrize("routing", TOP_K_MODES)
def test_router_dx_in_k6_where_d_logits_is_zero_off_the_chosen(kernels, monkeypatch, routing, aux):
    # Under topk_softmax and softmax_topk_norm with no loss on the logits, R's backward runs before
    # K6, which adds d_logits[t, e] * router_weight[e] to its rows, and K8 sums with no addend.
    # Elsewhere (softmax_topk, or a loss on the returned logits) the dense d_logits @ router_weight
    # stays. Either way the gradients are the other form's: bit for bit but dx, rounded elsewhere.
    F_ = sonicmoe.functional
    calls = []  # (op, whether it was given an addend)

    def with_addend(name, args, kwargs):
        if name == "grouped_gemm_kn":
            return kwargs.get("addend_scale") is not None
        return name == "combine_dx" and len(args) > 2 and args[2] is not None

    for name in ("router_backward", "router_backward_rows", "combine_dx", "grouped_gemm_kn"):
        def spy(*args, _name=name, _real=getattr(F_, name), **kwargs):
            calls.append((_name, with_addend(_name, args, kwargs)))
            return _real(*args, **kwargs)
        monkeypatch.setattr(F_, name, spy)
    leaves = layer_leaves(300, 128, 64, 8, "emulated-k6-addend", routing)
    g = torch.randn(300, 128, generator=generator("cpu", "g-k6-addend", routing))

    def grads(logits_returned):
        calls.clear()
        for t in leaves:
            t.grad = None
        out = sonicmoe.moe(*leaves, 2, routing=routing, return_router_logits=logits_returned)
        y = out[0] if logits_returned else out
        loss = (y.float() * g).sum() + (router_aux_loss(out[1]) if aux else 0)
        loss.backward()
        return [t.grad.clone() for t in leaves], dict(calls)

    folded = routing != "softmax_topk" and not aux
    dense_ops = {"router_backward": False, "grouped_gemm_kn": False, "combine_dx": True}
    got, ops = grads(aux)
    assert ops == ({"router_backward_rows": False, "grouped_gemm_kn": True, "combine_dx": False} if folded else
                   dense_ops)
    if folded:
        # The logits returned but unused: autograd hands the layer their zero gradient, which keeps
        # the dense form.
        want, want_ops = grads(True)
        assert want_ops == dense_ops
        assert rel(got[0], want[0]) <= 1e-2
        for name, a, b in zip(("drouter", "dw1", "dw2"), got[1:], want[1:]):
            assert torch.equal(a, b), name


@pytest.mark.parametrize("T,E,K,activation", [(0, 8, 2, "swiglu"), (1, 8, 2, "swiglu"), (7, 4, 4, "swiglu"),
                                              (500, 16, 3, "swiglu"), (7, 4, 4, "geglu"), (500, 16, 3, "geglu"),
                                              (500, 16, 3, "reglu")])
def test_moe_routed_gradients_with_empty_and_hot_experts(kernels, T, E, K, activation):
    d, n = 64, 48  # n % 32 != 0: H's trailing block stays in column order
    gen = generator("cpu", "emulated-routed", T, E, K)
    x, _, w1, w2 = make_layer(T, d, n, E, "cpu", gen)
    scores = torch.rand(T, K, generator=gen).softmax(-1)
    # Expert 0 takes every token's first choice; experts past E // 2 get none.
    experts = torch.stack([torch.zeros(T, dtype=torch.long)] +
                          [torch.randperm(E // 2 - 1, generator=gen)[:1].expand(T) + 1 + k for k in range(K - 1)],
                          dim=1) if T else torch.zeros(0, K, dtype=torch.long)
    experts = experts.clamp(max=E // 2)
    leaves = [t.clone().requires_grad_(True) for t in (x, w1, w2, scores)]
    out = sonicmoe.moe_routed(*leaves, experts, activation=activation)
    assert T == 0 or made_by(out, "_MoEExperts")
    ref_leaves = [t.detach().double().requires_grad_(True) for t in (x, w1, w2, scores)]
    ref = reference.moe_routed(*ref_leaves, experts, activation=activation)
    assert out.shape == (T, d)
    if T == 0:
        return
    g = torch.randn(T, d, generator=gen)
    out.backward(g.to(out.dtype))
    ref.backward(g.double())
    assert rel(out.detach(), ref.detach()) <= 1e-2
    for name, got, want in zip(("dx", "dw1", "dw2", "dscores"), leaves, ref_leaves):
        assert torch.isfinite(got.grad).all(), name
        assert rel(got.grad, want.grad) <= 1e-2, f"{name}: {rel(got.grad, want.grad):.3e}"
    idle = E // 2 + 1
    assert not leaves[1].grad[idle:].any() and not leaves[2].grad[idle:].any()  # idle experts: exact zeros


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("tile,rule", [(64, "nearest"), (16, "up"), (32, "down")])
def test_token_rounding_gradients(kernels, tile, rule, activation):
    # The dense path: upper-bound buffers (rows past offsets[E] are NaN in the emulation, so a
    # consumer that read them would show it), combine_csr, the scores' gradient into (T, E).
    T, d, n, E, K = 200, 64, 64, 8, 2
    leaves = layer_leaves(T, d, n, E, "emulated-rounding", tile, rule)
    x, router, w1, w2 = leaves
    out = sonicmoe.moe(x, router, w1, w2, K, routing="token_rounding", tile=tile, rule=rule, activation=activation)
    assert made_by(out, "_MoEDenseExperts")
    g = torch.randn(out.shape, generator=generator("cpu", "g-rounding", tile, rule))
    out.backward(g.to(out.dtype))
    with torch.no_grad():  # the layer's own assignment
        _, _, assigned_t = token_rounding_expert_major(F.linear(x, router), K, tile, rule, fp32_probs=True)
    ref = [t.detach().double().requires_grad_(True) for t in leaves]
    rx, rrouter, rw1, rw2 = ref
    assigned = assigned_t.t()
    ref_out = reference.moe_dense_routed(rx, rw1, rw2, (rx @ rrouter.t()).softmax(-1) * assigned, assigned,
                                         activation=activation)
    ref_out.backward(g.double())
    assert rel(out.detach(), ref_out.detach()) <= 1e-2
    for name, got, want in zip(("dx", "drouter", "dw1", "dw2"), leaves, ref):
        assert torch.isfinite(got.grad).all(), name
        assert rel(got.grad, want.grad) <= 2e-2, f"{name}: {rel(got.grad, want.grad):.3e}"


def test_backward_saves_only_x_h_scores_and_metadata(kernels):
    # docs/design.md §3, as test_moe.py checks it on the GPU: beyond x and the parameters the top-K layer
    # keeps H, the scores and int32 routing metadata.
    T, d, n, E, K = 64, 32, 32, 8, 2
    leaves = layer_leaves(T, d, n, E, "emulated-saved")
    own = {t.data_ptr() for t in leaves}
    saved = {}

    def pack(t):
        if t.data_ptr() not in own:
            saved[t.data_ptr()] = (tuple(t.shape), t.dtype)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = sonicmoe.moe(*leaves, K)
    M = T * K
    expected = [((M, 2 * n), torch.bfloat16), ((T, K), torch.float32), ((T, K), torch.int32),
                ((E + 1,), torch.int32), ((M,), torch.int32), ((T, K), torch.int32)]
    assert sorted(saved.values(), key=str) == sorted(expected, key=str)
    out.float().sum().backward()


def test_no_grad_keeps_no_h(kernels):
    x, router, w1, w2 = layer_leaves(64, 32, 32, 8, "emulated-no-grad")
    calls = []
    real = sonicmoe.functional.up_proj

    def spy(*args, **kwargs):
        h, a = real(*args, **kwargs)
        calls.append(h.shape[0])
        return h, a

    sonicmoe.functional.up_proj = spy
    try:
        with torch.no_grad():
            sonicmoe.moe(x, router, w1, w2, 2)
    finally:
        sonicmoe.functional.up_proj = real
    assert calls == [0]  # H not written


@pytest.mark.parametrize("routing", ["topk_softmax", "token_rounding"])
def test_autocast_runs_the_kernel_path_on_the_cast_tensors(kernels, routing):
    # fp32 leaves under autocast(bfloat16) reach the layer's autograd Functions as bf16 casts: the
    # output and the gradients (cast back to fp32) are those of bf16 leaves, bit for bit.
    gen = generator("cpu", "emulated-autocast", routing)
    fp32 = [t.float().requires_grad_(True) for t in make_layer(300, 128, 64, 8, "cpu", gen)]
    low = [t.detach().bfloat16().requires_grad_(True) for t in fp32]
    g = torch.randn(300, 128, generator=gen).bfloat16()
    outs = []
    for leaves in (fp32, low):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = sonicmoe.moe(*leaves, 2, routing=routing, tile=64)
        assert made_by(out, "_MoEDenseExperts" if routing == "token_rounding" else "_MoELayer")
        assert out.dtype == torch.bfloat16
        out.backward(g)
        outs.append(out.detach())
    assert torch.equal(outs[0], outs[1])
    for name, got, want in zip(("dx", "drouter", "dw1", "dw2"), fp32, low):
        assert got.grad.dtype == torch.float32 and torch.equal(got.grad, want.grad.float()), name


def test_strided_x_reaches_the_kernels_as_contiguous_rows(kernels):
    gen = generator("cpu", "emulated-strided")
    x, router, w1, w2 = make_layer(300, 128, 64, 8, "cpu", gen)
    base = x.t().contiguous().requires_grad_(True)
    out = sonicmoe.moe(base.t(), router, w1, w2, 2)
    assert made_by(out, "_MoELayer") and torch.equal(out, sonicmoe.moe(x, router, w1, w2, 2))
    out.backward(torch.ones_like(out))
    want = x.clone().requires_grad_(True)
    sonicmoe.moe(want, router, w1, w2, 2).backward(torch.ones_like(out))
    assert torch.equal(base.grad.t(), want.grad)


@pytest.mark.parametrize("layer", ["moe", "moe_routed"])
def test_one_stream_tail_starts_after_dh_and_a_prime_are_freed(kernels, monkeypatch, layer):
    # The one-stream backward frees K4's dH and A' before its tail (K8, and the router's part in
    # moe's layer) allocates two T x d outputs: held, they raised the step's peak by those
    # (451 MiB at deepseek-v3).
    F_ = sonicmoe.functional
    k4_outputs, alive_at_k8 = [], []
    real_k4, real_k8 = F_.down_proj_grad, F_.combine_dx

    def k4(*args, **kwargs):
        out = real_k4(*args, **kwargs)
        k4_outputs.extend(weakref.ref(t) for t in out[:2])  # dH, A'
        return out

    def k8(*args, **kwargs):
        alive_at_k8.append([ref() is not None for ref in k4_outputs])
        return real_k8(*args, **kwargs)

    monkeypatch.setattr(F_, "down_proj_grad", k4)
    monkeypatch.setattr(F_, "combine_dx", k8)
    x, router, w1, w2 = layer_leaves(200, 64, 48, 8, "emulated-freed", layer)
    if layer == "moe":
        out = sonicmoe.moe(x, router, w1, w2, 2)
    else:
        with torch.no_grad():
            scores, experts = sonicmoe.router_topk(F.linear(x, router), 2, "topk_softmax")
        out = sonicmoe.moe_routed(x, w1, w2, scores.requires_grad_(True), experts)
    out.float().sum().backward()
    assert alive_at_k8 == [[False, False]]


def compiled_against_eager(fn, leaves, g, backend, call=lambda f, leaves: f(*leaves)):
    """The output and the leaves' gradients of call(f, leaves), with f = fn eager and f = fn under
    torch.compile(fullgraph=True): (name, eager, compiled) per result."""
    results = list(eager_and_compiled(fn, torch.compile(fn, fullgraph=True, backend=backend), leaves, g, call))
    torch._dynamo.reset()
    return results


# aot_eager runs the traced, partitioned graphs on the same ops (results identical to eager);
# inductor also generates code for the torch ops between them (its fused adds round once where
# eager rounds twice, hence a bf16-level tolerance).
COMPILE_TOLERANCE = {"aot_eager": 0.0, "inductor": 1e-2}


@pytest.mark.parametrize("backend", list(COMPILE_TOLERANCE))
@pytest.mark.parametrize("routing", ["topk_softmax", "softmax_topk", "token_rounding"])
def test_torch_compile_fullgraph_matches_eager(kernels, routing, backend):
    # The layer traces into one graph (every op has a fake; no host sync); its compiled forward
    # and backward (AOTAutograd's joint graph, partitioned) match eager on the same ops. Token
    # rounding rounds up to tile = T: every chosen expert takes all T tokens, so no ranking, which
    # a compiled softmax's last bit could change at a near tie (test_moe.py's GPU test does so too).
    T = 128
    leaves = layer_leaves(T, 64, 32, 8, "emulated-compile", routing)
    g = torch.randn(T, 64, generator=generator("cpu", "g-compile", routing)).bfloat16()
    opts = dict(tile=T, rule="up") if routing == "token_rounding" else {}

    def layer(x, router, w1, w2):
        return sonicmoe.moe(x, router, w1, w2, 2, routing=routing, **opts)

    for name, eager, compiled in compiled_against_eager(layer, leaves, g, backend):
        assert rel(compiled, eager.float()) <= COMPILE_TOLERANCE[backend], name


@pytest.mark.parametrize("activation", ["geglu", "reglu"])
@pytest.mark.parametrize("routing", ["topk_softmax", "token_rounding"])
def test_torch_compile_fullgraph_with_other_activations(kernels, routing, activation):
    # The activation is a constant of the traced graph: the ops' fakes take it, and the compiled
    # layer matches eager on the same ops.
    T = 128
    leaves = layer_leaves(T, 64, 32, 8, "emulated-compile-act", routing, activation)
    g = torch.randn(T, 64, generator=generator("cpu", "g-compile-act", routing, activation)).bfloat16()
    opts = dict(tile=T, rule="up") if routing == "token_rounding" else {}

    def layer(x, router, w1, w2):
        return sonicmoe.moe(x, router, w1, w2, 2, routing=routing, activation=activation, **opts)

    for name, eager, compiled in compiled_against_eager(layer, leaves, g, "aot_eager"):
        assert rel(compiled, eager.float()) <= COMPILE_TOLERANCE["aot_eager"], name


@pytest.mark.parametrize("backend", list(COMPILE_TOLERANCE))
def test_torch_compile_fullgraph_with_router_dx_in_k6(kernels, backend):
    # The fold's ops (router_backward_rows, grouped_gemm_kn's addend) trace by their fakes.
    leaves = layer_leaves(128, 64, 32, 8, "emulated-compile-k6")
    g = torch.randn(128, 64, generator=generator("cpu", "g-compile-k6")).bfloat16()

    def layer(x, router, w1, w2):
        return sonicmoe.moe(x, router, w1, w2, 2, routing="softmax_topk_norm")

    for name, eager, compiled in compiled_against_eager(layer, leaves, g, backend):
        assert rel(compiled, eager.float()) <= COMPILE_TOLERANCE[backend], name


@pytest.mark.parametrize("backend", list(COMPILE_TOLERANCE))
def test_torch_compile_fullgraph_with_router_logits(kernels, backend):
    # _MoELayer with its second output traces too; the auxiliary loss on the logits rides on the
    # output (added to every element), so its gradient is in every leaf's.
    T = 128
    leaves = layer_leaves(T, 64, 32, 8, "emulated-compile-logits")
    g = torch.randn(T, 64, generator=generator("cpu", "g-compile-logits")).bfloat16()

    def layer(x, router, w1, w2):
        out, logits = sonicmoe.moe(x, router, w1, w2, 2, return_router_logits=True)
        return out + (router_aux_loss(logits) / T).to(out.dtype)

    for name, eager, compiled in compiled_against_eager(layer, leaves, g, backend):
        assert rel(compiled, eager.float()) <= COMPILE_TOLERANCE[backend], name


@pytest.mark.parametrize("backend", list(COMPILE_TOLERANCE))
def test_token_rounding_experts_traced_match_eager(kernels, backend):
    # Token rounding's expert Function traced on the ops' emulation matches eager, with the
    # dense_layout op and with the torch-built layout. (On the H200, Inductor's Triton code read a
    # sliced searchsorted boundary from its buffer's start, pytorch/pytorch#182343: every score
    # gradient one expert off. Its CPU code does not, so only test_moe.py's GPU fullgraph test
    # can see that.)
    T, d, n, E, K, tile = 256, 64, 64, 8, 2, 32
    leaves = layer_leaves(T, d, n, E, "emulated-rounding-compile")
    g = torch.randn(T, d, generator=generator("cpu", "g-rounding-compile")).bfloat16()

    def dense(x, w1, w2, probs, probs_t, assigned_t):
        return sonicmoe.functional._MoEDenseExperts.apply(x, w1, w2, probs, probs_t, assigned_t, K, tile, True,
                                                          "swiglu")

    def layer(experts, leaves):
        # The routing stays eager, outside the graph: a compiled softmax may differ from eager's in
        # the last bit and move a near-tied token at a rounding boundary (another valid assignment).
        x, router, w1, w2 = leaves
        probs, probs_t, assigned_t = token_rounding_expert_major(F.linear(x, router), K, tile, "nearest",
                                                                 fp32_probs=True)
        return experts(x, w1, w2, probs, probs_t, assigned_t)

    by_kernel = sonicmoe.functional.dense_routing_metadata_expert_major
    try:
        for layout in (by_kernel, sonicmoe.routing.dense_routing_metadata_by_torch):
            sonicmoe.functional.dense_routing_metadata_expert_major = layout
            for name, eager, compiled in compiled_against_eager(dense, leaves, g, backend, call=layer):
                assert rel(compiled, eager.float()) <= COMPILE_TOLERANCE[backend], (layout.__name__, name)
    finally:
        sonicmoe.functional.dense_routing_metadata_expert_major = by_kernel


@pytest.mark.parametrize("routing", ["topk_softmax", "token_rounding"])
def test_torch_compile_dynamic_tokens_one_graph(kernels, routing):
    # With T dynamic the layer compiles once for every token count (a trainer's varying batch):
    # nothing in it specialises on T (token rounding's row bound follows T, so dense_layout takes
    # it as a SymInt). aot_eager runs the same ops as eager, so every result matches exactly.
    # Only T is marked dynamic (test_moe.py's GPU twin says why not dynamic=True).
    def layer(x, router, w1, w2):
        return sonicmoe.moe(x, router, w1, w2, 2, routing=routing, tile=16)

    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    try:
        for i, T in enumerate((96, 160, 300)):
            leaves = layer_leaves(T, 64, 32, 8, "emulated-dynamic", routing, T)
            torch._dynamo.mark_dynamic(leaves[0], 0)
            g = torch.randn(T, 64, generator=generator("cpu", "g-dynamic", routing, T)).bfloat16()
            for name, eager, comp in eager_and_compiled(layer, compiled, leaves, g, may_recompile=i == 0):
                assert torch.equal(comp, eager), (T, name)
    finally:
        torch._dynamo.reset()


def test_top_k_past_the_combines_limit_is_refused_before_any_op(kernels, monkeypatch):
    # K3 / K8 hold a token's pairs in one warp: the top-K layer refuses top_k > 32 by rule before
    # the router's GEMM or any op; moe_routed refuses 33 experts a token the same way.
    T, d, n, E, K = 8, 32, 32, 40, 33
    x, router, w1, w2 = layer_leaves(T, d, n, E, "emulated-top-k-33")
    ran = []
    monkeypatch.setattr(torch.nn.functional, "linear", lambda *a: ran.append("linear"))
    with pytest.raises(ValueError, match=re.escape("top_k = 33 breaks the rule: must be <= 32 on the kernels")):
        sonicmoe.moe(x, router, w1, w2, K, routing="softmax_topk_norm")
    monkeypatch.undo()
    assert ran == []
    scores, experts = torch.rand(T, K), torch.randint(0, E, (T, K))
    with pytest.raises(ValueError, match=re.escape("experts.shape[1] = 33 breaks the rule: must be <= 32")):
        sonicmoe.moe_routed(x, w1, w2, scores, experts)


def test_token_rounding_takes_a_top_k_past_32(kernels):
    # Token rounding combines by token_offsets (combine_csr), so top_k has no kernel limit there.
    T, d, n, E, K = 16, 32, 32, 40, 33
    x, router, w1, w2 = layer_leaves(T, d, n, E, "emulated-rounding-top-k-33")
    out = sonicmoe.moe(x, router, w1, w2, K, routing="token_rounding", tile=8)
    assert made_by(out, "_MoEDenseExperts") and torch.isfinite(out).all()
    out.float().sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (x, router, w1, w2))


@pytest.mark.parametrize("routing", ["softmax_topk_norm", "token_rounding"])
def test_more_experts_than_the_routing_kernels_take(kernels, routing):
    # E past R's limit (ROUTER_MAX_EXPERTS): top-K scores come from torch and go through
    # moe_routed; token rounding's assignment and sorted layout are built by torch ops, its expert
    # MLPs still run on the (emulated) kernels over upper-bound buffers. The emulated routing_metadata
    # refuses E past the limit as the op does, so the layer's own layout must take over.
    # test_moe.py runs the top-K case on the GPU.
    E = sonicmoe._ops.ROUTER_MAX_EXPERTS + 8
    T, d, n, K, tile = 96, 32, 32, 2, 8
    leaves = layer_leaves(T, d, n, E, "emulated-many-experts", routing)
    x, router, w1, w2 = leaves
    out = sonicmoe.moe(x, router, w1, w2, K, routing=routing, tile=tile)
    assert made_by(out, "_MoEDenseExperts" if routing == "token_rounding" else "_MoEExperts")
    g = torch.randn(out.shape, generator=generator("cpu", "g-many", routing))
    out.backward(g.to(out.dtype))
    ref = [t.detach().double().requires_grad_(True) for t in leaves]
    rx, rrouter, rw1, rw2 = ref
    with torch.no_grad():
        logits = F.linear(x, router).float()
        if routing == "token_rounding":
            assigned = token_rounding_expert_major(logits, K, tile, "nearest")[2].t()
        else:
            experts = logits.softmax(-1).topk(K, dim=-1).indices
    probs = (rx @ rrouter.t()).softmax(-1)
    if routing == "token_rounding":
        ref_out = reference.moe_dense_routed(rx, rw1, rw2, probs * assigned, assigned)
    else:
        scores = probs.gather(1, experts)
        ref_out = reference.moe_routed(rx, rw1, rw2, scores / scores.sum(-1, keepdim=True), experts)
    ref_out.backward(g.double())
    assert rel(out.detach(), ref_out.detach()) <= 1e-2
    for name, got, want in zip(("dx", "drouter", "dw1", "dw2"), leaves, ref):
        assert rel(got.grad, want.grad) <= 2e-2, f"{name}: {rel(got.grad, want.grad):.3e}"


def test_module_trains_with_token_rounding_and_evaluates_with_top_k(kernels):
    # sonicmoe.MoE routes by token rounding in training mode and by softmax_topk in eval mode, on
    # the kernel path both ways; leading batch dims are flattened and restored.
    torch.manual_seed(0)  # the layer's init draws from the global generator
    layer = sonicmoe.MoE(32, 32, 8, 2, routing="token_rounding", tile=16, dtype=torch.bfloat16)
    x = torch.randn(2, 40, 32, generator=generator("cpu", "module")).bfloat16().requires_grad_(True)
    out = layer(x)
    assert out.shape == x.shape and made_by(out, "_MoEDenseExperts")
    out.float().square().sum().backward()
    assert x.grad.shape == x.shape and all(torch.isfinite(p.grad).all() for p in layer.parameters())
    layer.eval()
    with torch.no_grad():
        evaluated = layer(x)
        # The reference with the layer's own routing decisions (its bf16 logits), not a second
        # router that near-ties could send elsewhere (docs/design.md §7).
        x2 = x.reshape(-1, 32)
        experts = F.linear(x2, layer.router_weight).float().softmax(-1).topk(2, dim=-1).indices
        x64, router64, w1, w2 = (t.double() for t in (x2, layer.router_weight, layer.w1, layer.w2))
        scores = (x64 @ router64.t()).softmax(-1).gather(1, experts)
        want = reference.moe_routed(x64, w1, w2, scores, experts).reshape(x.shape)
    assert rel(evaluated, want) <= 1e-2


# ------------------------------------------------------------------ what a caller may hand the layer
# The emulation runs each op's own argument checks first (kernel_emulation._checked), so an
# argument the real op would refuse fails here as on the GPU. Each case below is a valid call
# that once reached an op in a form it refuses.

def test_moe_routed_takes_a_sorted_routers_strided_views_and_narrow_ids(kernels):
    T, d, n, E, K = 40, 32, 32, 8, 2
    x, router, w1, w2 = layer_leaves(T, d, n, E, "emulated-strided-routing")
    probs = F.linear(x, router).float().softmax(-1).detach()
    sorted_probs, order = probs.sort(-1, descending=True)
    scores, experts = sorted_probs[:, :K], order[:, :K]  # strided views, as a sorting router gives
    assert not scores.is_contiguous() and not experts.is_contiguous()
    want = reference.moe_routed(*(t.detach().double() for t in (x, w1, w2)), scores.double(), experts)
    for ids in (experts, experts.to(torch.uint8), experts.to(torch.int16)):
        for s in (scores, scores.t().contiguous().t()):
            with torch.no_grad():
                out = sonicmoe.moe_routed(x, w1, w2, s, ids)
            assert rel(out, want) <= 1e-2, (ids.dtype, s.stride())


@pytest.mark.parametrize("routing", ["softmax_topk_norm", "token_rounding", "routed"])
def test_backward_takes_a_grad_at_any_offset(kernels, routing):
    # A grad that is a view 2 bytes into a buffer (a narrow or cat's backward): K4 needs 16-byte rows.
    T, d, n, E, K = 24, 32, 32, 8, 2
    leaves = layer_leaves(T, d, n, E, "emulated-grad-offset", routing)
    x, router, w1, w2 = leaves
    if routing == "routed":
        scores, experts = F.linear(x, router).float().softmax(-1).topk(K, dim=-1)
        out = sonicmoe.moe_routed(x, w1, w2, scores, experts)
    else:
        out = sonicmoe.moe(x, router, w1, w2, K, routing=routing, tile=8)
    buf = torch.randn(T * d + 1, generator=generator("cpu", "g-offset", routing)).bfloat16()
    grad = buf[1:].view(T, d)
    assert grad.data_ptr() % 16
    out.backward(grad)
    assert all(torch.isfinite(t.grad).all() for t in (x, w1, w2))


def test_misaligned_or_empty_weights_are_refused_by_rule(kernels):
    T, d, n, E, K = 16, 32, 32, 4, 2
    x, router, w1, w2 = layer_leaves(T, d, n, E, "emulated-weight-rules")
    flat = torch.zeros(w1.numel() + 1, dtype=w1.dtype)
    w1_view = flat[1:].view(w1.shape)  # contiguous, 2 bytes off 16
    with pytest.raises(ValueError, match=r"w1.data_ptr\(\) = \d+ breaks the rule: must be 16-byte aligned"):
        sonicmoe.moe(x, router, w1_view, w2, K)
    with pytest.raises(ValueError, match=re.escape("n = 0 breaks the rule: must be a positive multiple of 8")):
        sonicmoe.moe(x, router, w1[:, :0], w2[:, :, :0].contiguous(), K)


def test_token_rounding_flattens_leading_dims_of_any_length(kernels):
    # (batch, seq, d) with seq not a multiple of 8: the rules apply to d, not to seq.
    T, d, n, E, K = 10, 32, 32, 8, 2
    x, router, w1, w2 = layer_leaves(T, d, n, E, "emulated-3d-rounding")
    out = sonicmoe.moe(x.reshape(2, 5, d), router, w1, w2, K, routing="token_rounding", tile=8)
    flat = sonicmoe.moe(x, router, w1, w2, K, routing="token_rounding", tile=8)
    assert out.shape == (2, 5, d) and torch.equal(out.reshape(T, d), flat)


def test_routing_helpers_take_strided_bf16_logits_and_integer_masks(kernels):
    T, E, K, tile = 32, 8, 2, 8
    logits = torch.randn(E, T, generator=generator("cpu", "helpers")).bfloat16().t()  # a transposed view
    probs, probs_t, assigned_t = sonicmoe.routing.token_rounding_expert_major(logits, K, tile)
    _, _, want = sonicmoe.routing.token_rounding_expert_major(logits.contiguous(), K, tile)
    assert torch.equal(assigned_t, want)
    scores = torch.rand(T, E)
    assigned = want.t()
    bound = sonicmoe.routing.dense_row_bound(T, E, K, tile)
    as_bool = sonicmoe.routing.dense_routing_metadata(scores, assigned, bound)
    as_uint8 = sonicmoe.routing.dense_routing_metadata(scores, assigned.to(torch.uint8), bound)
    assert all(torch.equal(a, b) for a, b in zip(as_bool, as_uint8))


def test_blackwell_takes_dw1_on_k7_where_hopper_takes_the_copy_of_x(kernels, monkeypatch):
    # At 1024 < n < 2048 the Hopper layer takes dW1 from a copy of x and torch._grouped_mm;
    # on Blackwell that leaves an idle expert's gradient unwritten (pytorch/pytorch#172439), so the
    # layer takes K7 there (a stand-in B200: the emulated ops run on the CPU).
    calls = []

    def spy(*args, _real=sonicmoe.functional.weight_grad, **kwargs):
        calls.append(args[4])  # gather_a: K5 True, K7 False
        return _real(*args, **kwargs)

    monkeypatch.setattr(sonicmoe.functional, "weight_grad", spy)
    monkeypatch.setattr(sonicmoe.functional, "_on_blackwell", lambda device: True)
    monkeypatch.setattr(torch, "_grouped_mm", lambda *a, **k: pytest.fail("dW1 took the copy of x"))
    x, router, w1, w2 = layer_leaves(64, 64, 1536, 4, "blackwell-dw1")
    assert not sonicmoe.functional._dw1_on_k7(1536)
    sonicmoe.moe(x, router, w1, w2, 2).float().sum().backward()
    assert sorted(calls) == [False, True]
    assert torch.isfinite(w1.grad).all() and torch.isfinite(w2.grad).all()


@pytest.mark.parametrize("routing", TOP_K_MODES)
def test_hopper_dw1_over_scatter_rows_copy_of_x(kernels, monkeypatch, routing):
    # At 1024 < n < 2048 the Hopper layer takes dW1 from torch._grouped_mm over x in the sorted
    # layout, which scatter_rows makes from the token's rows (rev_idx); every gradient as the
    # reference's (the emulated scatter leaves NaN in a row it does not write).
    calls = []

    def spy(*args, _real=sonicmoe.functional.scatter_rows, **kwargs):
        calls.append(args[1].shape)
        return _real(*args, **kwargs)

    monkeypatch.setattr(sonicmoe.functional, "scatter_rows", spy)
    leaves = layer_leaves(100, 64, 1536, 4, "hopper-dw1-scatter", routing)
    x, router, w1, w2 = leaves
    assert not sonicmoe.functional._dw1_on_k7(1536)
    out = sonicmoe.moe(x, router, w1, w2, 2, routing=routing)
    g = torch.randn(out.shape, generator=generator("cpu", "g-scatter", routing))
    out.backward(g.to(out.dtype))
    assert calls == [(100, 2)]
    with torch.no_grad():
        experts = sonicmoe.router_topk(F.linear(x, router), 2, routing)[1].long()
    _, ref = reference_top_k(leaves, experts, routing, g)
    for name, got, want in zip(("dx", "drouter", "dw1", "dw2"), leaves, ref):
        assert torch.isfinite(got.grad).all(), name
        assert rel(got.grad, want.grad) <= 2e-2, f"{name}: {rel(got.grad, want.grad):.3e}"
