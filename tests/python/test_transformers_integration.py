"""sonicmoe.integrations.transformers: tiny random models of each covered family, built with
transformers' own config classes, against the same models unswapped: logits, losses (with the
load-balancing loss), router logits and every parameter's gradient; the routing decisions are
checked to be the same ones. CPU runs sonicmoe.reference in fp32; the GPU tests run the kernels
in bf16 against fp32 with the routing pinned to the fp32 model's decisions."""

import copy
import importlib
import inspect
import subprocess
import sys

import pytest
import torch
from torch import nn

from conftest import requires_kernel_gpu

try:
    import transformers
except ImportError:
    transformers = None

requires_transformers = pytest.mark.skipif(transformers is None, reason="needs the transformers package "
                                           "(pip install 'transformers>=5.17,<6')")
if transformers is not None:
    from sonicmoe.integrations import transformers as hf

FAMILIES = ("qwen3_moe", "qwen2_moe", "olmoe", "mixtral", "deepseek_v3")
# Wide enough weights that the experts move the logits and the router's choices stand well apart.
INIT_STD = 0.1


def rel(a, b):
    """Relative Frobenius error of a against b (0 where both are zero)."""
    a, b = a.detach().double(), b.detach().double()
    denom = b.norm()
    return (a - b).norm().item() / denom.item() if denom > 0 else (a - b).norm().item()


def tiny_config(family, hidden=64, moe_n=32, **overrides):
    common = dict(vocab_size=128, hidden_size=hidden, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, initializer_range=INIT_STD,
                  tie_word_embeddings=False)
    if family == "qwen3_moe":
        cfg = transformers.Qwen3MoeConfig(**common, head_dim=16, intermediate_size=128, moe_intermediate_size=moe_n,
                                          num_experts=8, num_experts_per_tok=2, norm_topk_prob=True)
    elif family == "qwen2_moe":
        cfg = transformers.Qwen2MoeConfig(**common, intermediate_size=128, moe_intermediate_size=moe_n,
                                          shared_expert_intermediate_size=64, num_experts=8, num_experts_per_tok=2,
                                          norm_topk_prob=False)
    elif family == "olmoe":
        cfg = transformers.OlmoeConfig(**common, intermediate_size=moe_n, num_experts=8, num_experts_per_tok=2,
                                       norm_topk_prob=False, eos_token_id=1)  # its default id is past our vocab
    elif family == "mixtral":
        cfg = transformers.MixtralConfig(**common, head_dim=16, intermediate_size=moe_n, num_local_experts=8,
                                         num_experts_per_tok=2)
    elif family == "deepseek_v3":
        # Three layers, the first dense (first_k_dense_replace): two MoE blocks and an MLP left as it is.
        common.update(num_hidden_layers=3, num_key_value_heads=4)  # MLA: as many kv heads as heads
        cfg = transformers.DeepseekV3Config(**common, intermediate_size=128, moe_intermediate_size=moe_n,
                                            n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2,
                                            n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=16,
                                            q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
                                            routed_scaling_factor=2.5, norm_topk_prob=True)
    else:
        raise ValueError(family)
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


def tiny_model(family, seed=0, **overrides):
    torch.manual_seed(seed)
    cfg = tiny_config(family, **overrides)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    with torch.no_grad():
        for name, module in model.named_modules():
            if name.endswith("mlp.gate") and hasattr(module, "e_score_correction_bias"):
                # A bias that changes choices, so that the test sees it used.
                module.e_score_correction_bias.copy_(0.1 * torch.randn_like(module.e_score_correction_bias))
    return model.float().eval()


def record_routing(model):
    """Each router call's (experts sorted per token, their weights in that order), appended to a list."""
    calls = []

    def hook(module, args, output):
        _, weights, experts = output
        order = experts.argsort(dim=-1)
        calls.append((experts.gather(1, order).detach(), weights.gather(1, order).detach()))

    handles = [m.register_forward_hook(hook) for name, m in model.named_modules() if name.endswith("mlp.gate")]
    return calls, handles


def run(model, ids, **kwargs):
    model.zero_grad(set_to_none=True)
    calls, handles = record_routing(model)
    out = model(ids, labels=ids, **kwargs)
    out.loss.backward()
    for h in handles:
        h.remove()
    grads = {name: p.grad for name, p in model.named_parameters()}
    return out, calls, grads


def assert_same_routing(ref_calls, calls):
    assert len(calls) == len(ref_calls)
    for i, ((ref_e, ref_w), (e, w)) in enumerate(zip(ref_calls, calls)):
        assert torch.equal(ref_e, e), f"router call {i}: the swapped model chose other experts (a near-tie)"
        assert rel(w, ref_w) < 1e-5


def count_moe_routed(monkeypatch):
    calls = []
    original = hf.moe_routed

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return original(*args, **kwargs)

    monkeypatch.setattr(hf, "moe_routed", counted)
    return calls


@requires_transformers
@pytest.mark.parametrize("family", FAMILIES)
def test_logits_losses_and_grads_match(family, monkeypatch):
    ref = tiny_model(family)
    model = copy.deepcopy(ref)
    report = hf.replace_moe_blocks(model)
    num_blocks = 2
    assert [f for _, f, _ in report.swapped] == [family] * num_blocks and report.left_alone == []
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    sonic_calls = count_moe_routed(monkeypatch)

    ref_out, ref_routing, ref_grads = run(ref, ids, output_router_logits=True)
    out, routing, grads = run(model, ids, output_router_logits=True)
    assert len(sonic_calls) == num_blocks  # the experts ran on SonicMoE
    assert_same_routing(ref_routing, routing)
    assert rel(out.logits, ref_out.logits) < 1e-5
    assert rel(out.loss, ref_out.loss) < 1e-5
    if family != "deepseek_v3":  # DeepSeek-V3's causal LM has no load-balancing loss
        assert ref_out.aux_loss is not None and rel(out.aux_loss, ref_out.aux_loss) < 1e-5
    # DeepSeek-V3's causal LM output has no router_logits field in transformers 5.17 (it has in 5.25).
    if hasattr(ref_out, "router_logits"):
        assert len(out.router_logits) == len(ref_out.router_logits) == num_blocks
        for got, want in zip(out.router_logits, ref_out.router_logits):
            assert rel(got, want) < 1e-5
    else:
        assert family == "deepseek_v3" and not hasattr(out, "router_logits")
    assert grads.keys() == ref_grads.keys()
    for name, want in ref_grads.items():
        assert want is not None and grads[name] is not None, name
        assert rel(grads[name], want) < 1e-5, name

    # Without router logits (no loss on them), in inference mode.
    with torch.no_grad():
        assert rel(model(ids).logits, ref(ids).logits) < 1e-5


@requires_transformers
@pytest.mark.parametrize("family", FAMILIES)
def test_same_parameters_names_and_interface(family):
    model = tiny_model(family)
    before = dict(model.named_parameters())
    state = model.state_dict()
    blocks = {name: type(m) for name, m in model.named_modules() if name.endswith(".mlp")}
    report = hf.replace_moe_blocks(model)

    after = dict(model.named_parameters())
    assert list(after) == list(before)  # names and order: optimizers' param groups line up
    assert all(after[name] is p for name, p in before.items())  # the same Parameters: no copy
    new_state = model.state_dict()
    assert list(new_state) == list(state)
    assert all(new_state[k].data_ptr() == v.data_ptr() for k, v in state.items())
    model.load_state_dict(state)  # an unswapped checkpoint loads as it is

    for name, _, routing in report.swapped:
        block = model.get_submodule(name)
        assert isinstance(block, hf.SonicMoeBlock) and block.routing == routing
        params = [(p.name, p.kind, p.default) for p in inspect.signature(type(block).forward).parameters.values()]
        assert params == [(p.name, p.kind, p.default)
                          for p in inspect.signature(blocks[name].forward).parameters.values()]
    expected = {"qwen3_moe": "softmax_topk_norm", "qwen2_moe": "softmax_topk", "olmoe": "softmax_topk",
                "mixtral": "topk_softmax"}.get(family, "sigmoid + e_score_correction_bias")
    assert all(r.startswith(expected) for _, _, r in report.swapped)
    if family == "deepseek_v3":  # its first layer's dense MLP is no MoE block: neither swapped nor listed
        assert type(model.model.layers[0].mlp).__name__ == "DeepseekV3MLP"
        assert [n for n, _, _ in report.swapped] == ["model.layers.1.mlp", "model.layers.2.mlp"]

    again = hf.replace_moe_blocks(model)
    assert again.swapped == [] and again.left_alone == []


@requires_transformers
def test_optimizer_built_before_the_swap_trains_the_swapped_model():
    ref = tiny_model("qwen3_moe")
    model = copy.deepcopy(ref)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    hf.replace_moe_blocks(model)
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(2))
    for m, o in ((ref, opt_ref), (model, opt)):
        for _ in range(2):
            o.zero_grad()
            m(ids, labels=ids, output_router_logits=True).loss.backward()
            o.step()
    start = dict(tiny_model("qwen3_moe").named_parameters())
    for (name, p), q in zip(ref.named_parameters(), model.parameters()):
        assert rel(q, start[name]) > 1e-3, name  # the optimizer moved it
        assert rel(q, p) < 1e-4, name  # as it moved the unswapped one (Adam magnifies ~1e-7 in tiny grads)


@requires_transformers
def test_mixtral_jitter_in_training():
    ref = tiny_model("mixtral", router_jitter_noise=0.1)
    model = copy.deepcopy(ref)
    hf.replace_moe_blocks(model)
    ref.train(), model.train()
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(3))
    outs = []
    for m in (ref, model):
        torch.manual_seed(4)  # the same noise draws
        outs.append(m(ids).logits)
    assert rel(outs[1], outs[0]) < 1e-5
    with torch.no_grad():  # and the noise is used: without it the logits differ
        assert rel(model.eval()(ids).logits, outs[0]) > 1e-4


@requires_transformers
@pytest.mark.parametrize("hidden_act,activation", [("silu", "swiglu"), ("gelu_pytorch_tanh", "geglu"),
                                                   ("gelu_new", "geglu"), ("gelu_fast", "geglu"), ("relu", "reglu")])
def test_experts_act_fn_picks_the_gated_activation(hidden_act, activation, monkeypatch):
    # GELU's tanh form (whichever transformers class computes it) runs as GeGLU, ReLU as ReGLU:
    # the swapped model's logits and gradients are the unswapped one's.
    ref = tiny_model("qwen3_moe", hidden_act=hidden_act)
    model = copy.deepcopy(ref)
    report = hf.replace_moe_blocks(model)
    assert len(report.swapped) == 2 and report.left_alone == []
    assert all(model.get_submodule(name).experts.activation == activation for name, _, _ in report.swapped)
    seen = []
    original = hf.moe_routed
    monkeypatch.setattr(hf, "moe_routed", lambda *a, **kw: seen.append(kw["activation"]) or original(*a, **kw))
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(6))
    ref_out, ref_routing, ref_grads = run(ref, ids)
    out, routing, grads = run(model, ids)
    assert seen == [activation] * 2
    assert_same_routing(ref_routing, routing)
    assert rel(out.logits, ref_out.logits) < 1e-5
    for name, want in ref_grads.items():
        assert rel(grads[name], want) < 1e-5, name


@requires_transformers
@pytest.mark.parametrize("act_fn", [nn.GELU(), nn.GELU(approximate="tanh"), nn.ReLU(), nn.Tanh()],
                         ids=["gelu-erf", "gelu-tanh", "relu", "tanh"])
def test_act_fn_modules_map_or_are_named_in_the_report(act_fn):
    model = tiny_model("olmoe")
    for layer in model.model.layers:
        layer.mlp.experts.act_fn = act_fn
    report = hf.replace_moe_blocks(model)
    want = {"GELU": None, "GELU-tanh": "geglu", "ReLU": "reglu", "Tanh": None}[
        type(act_fn).__name__ + ("-tanh" if getattr(act_fn, "approximate", "") == "tanh" else "")]
    if want is None:
        assert report.swapped == [] and len(report.left_alone) == 2
        reason = report.left_alone[0][2]
        assert reason.startswith(f"experts.act_fn is {type(act_fn).__name__}"), reason
        assert "GELU's tanh form as GeGLU" in reason
        if isinstance(act_fn, nn.GELU):
            assert "approximate='none'" in reason
    else:
        assert len(report.swapped) == 2
        assert all(model.get_submodule(name).experts.activation == want for name, _, _ in report.swapped)


class _OtherMoE(nn.Module):
    """An MoE block this integration does not know."""

    def __init__(self):
        super().__init__()
        self.router = nn.Linear(8, 4)
        self.experts = nn.ModuleList(nn.Linear(8, 8) for _ in range(4))


@requires_transformers
def test_unknown_and_unmappable_blocks_are_left_alone():
    model = tiny_model("qwen3_moe")
    model.model.layers[1].mlp.experts.act_fn = nn.GELU()  # erf GELU: no gated activation of the kernels
    model.extra = _OtherMoE()
    original = model.model.layers[1].mlp
    with pytest.raises(ValueError, match="left alone"):
        hf.replace_moe_blocks(model, strict=True)
    assert type(model.model.layers[0].mlp).__name__ == "Qwen3MoeSparseMoeBlock"  # strict changed nothing

    report = hf.replace_moe_blocks(model)
    assert [n for n, _, _ in report.swapped] == ["model.layers.0.mlp"]
    left = {name: (cls, reason) for name, cls, reason in report.left_alone}
    assert left.keys() == {"model.layers.1.mlp", "extra"}
    assert "act_fn" in left["model.layers.1.mlp"][1] and left["extra"][0] == "_OtherMoE"
    assert model.model.layers[1].mlp is original
    assert "left alone model.layers.1.mlp" in str(report)

    other = tiny_model("olmoe")
    report = hf.replace_moe_blocks(other, families=["qwen3_moe"])
    assert report.swapped == [] and len(report.left_alone) == 2
    with pytest.raises(ValueError, match="families"):
        hf.replace_moe_blocks(other, families=["llama"])


@requires_transformers
def test_block_with_hooks_is_left_alone():
    model = tiny_model("olmoe")
    model.model.layers[0].mlp.register_forward_hook(lambda *args: None)
    report = hf.replace_moe_blocks(model)
    assert [n for n, _, _ in report.swapped] == ["model.layers.1.mlp"]
    assert "hooks" in report.left_alone[0][2]


def test_import_guards(monkeypatch):
    # sonicmoe and sonicmoe.integrations import without transformers ...
    code = ("import sys; sys.modules['transformers'] = None; import sonicmoe, sonicmoe.integrations; "
            "assert 'transformers' not in [m.split('.')[0] for m in sys.modules if sys.modules[m] is not None]")
    env_path = str(importlib.import_module("sonicmoe").__file__).rsplit("/sonicmoe/", 1)[0]
    subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {env_path!r}); {code}"], check=True)
    # ... and the transformers integration names the missing package.
    monkeypatch.setitem(sys.modules, "transformers", None)
    monkeypatch.delitem(sys.modules, "sonicmoe.integrations.transformers", raising=False)
    with pytest.raises(ImportError, match="`transformers` package"):
        importlib.import_module("sonicmoe.integrations.transformers")


def _pin_routing(model, decisions):
    """Forward hooks making the model's routers choose the recorded experts, with the weights each
    family's router gives them from its own logits (so gradients still reach the router)."""
    calls = iter(decisions)

    def hook(module, args, output):
        logits, _, _ = output
        experts, _ = next(calls)
        if hasattr(module, "e_score_correction_bias"):  # DeepSeek-V3: sigmoid, norm, scaling
            weights = logits.sigmoid().gather(1, experts)
            if module.norm_topk_prob:
                weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
            weights = weights * module.routed_scaling_factor
        else:  # softmax over E, the chosen K, renormalised if norm_topk_prob
            weights = logits.float().softmax(dim=-1).gather(1, experts)
            if module.norm_topk_prob:
                weights = weights / weights.sum(dim=-1, keepdim=True)
            weights = weights.to(logits.dtype)
        return logits, weights, experts

    return [m.register_forward_hook(hook) for name, m in model.named_modules() if name.endswith("mlp.gate")]


@requires_kernel_gpu
@requires_transformers
@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3"])
def test_kernels_bf16_against_fp32(family, fp32_matmul_reference):
    """bf16 on the kernels against the fp32 model on the same routing decisions; the model's own
    bf16 run (its experts in eager PyTorch) gives the scale of the error bf16 itself brings."""
    ref = tiny_model(family, hidden=256, moe_n=128).cuda()  # shapes the kernel tests cover
    ids = torch.randint(0, 128, (4, 64), generator=torch.Generator().manual_seed(5)).cuda()
    ref_out, ref_routing, ref_grads = run(ref, ids, output_router_logits=True)

    errors = {}
    for swapped in (False, True):
        model = copy.deepcopy(ref).to(torch.bfloat16)
        if family == "deepseek_v3":  # its router weight and bias stay fp32, as from_pretrained keeps them
            for name, m in model.named_modules():
                if name.endswith("mlp.gate"):
                    m.float()
        if swapped:
            report = hf.replace_moe_blocks(model)
            assert len(report.swapped) == 2 and not report.left_alone
        handles = _pin_routing(model, ref_routing)
        out, _, grads = run(model, ids, output_router_logits=True)
        for h in handles:
            h.remove()
        assert torch.isfinite(out.logits).all()
        errs = {"logits": rel(out.logits, ref_out.logits)}
        errs.update({name: rel(grads[name], want) for name, want in ref_grads.items()})
        errors[swapped] = errs
    for name, err in errors[True].items():
        assert err <= max(1e-2, 2 * errors[False][name]), (name, err, errors[False][name])
