"""Swap a loaded Hugging Face transformers model's sparse-MoE blocks for SonicMoE blocks in place.

    from sonicmoe.integrations.transformers import replace_moe_blocks
    report = replace_moe_blocks(model)   # model: e.g. Qwen3MoeForCausalLM.from_pretrained(...)
    print(report)

Covered (transformers 5.x, whose experts are stored fused): Qwen3-MoE, Qwen2-MoE, OLMoE,
Mixtral, DeepSeek-V3. Their experts hold gate_up_proj (E, 2n, d), rows [0, n) gate and
[n, 2n) up, and down_proj (E, d, n): exactly sonicmoe's w1 / w2 (docs/design.md §2), so the swapped
block shares the same Parameter objects under the same names: no copy, and state_dict,
checkpoints and optimizers see the model they saw before.

The swapped block keeps the model's own router module (`gate`) and runs it as the model does:
the routing decisions are the model's own (softmax / sigmoid, group-limited top-K, bias, norm,
scaling), and the router logits reach the model's output recorder (output_router_logits=True,
the load-balancing loss) through the hooks transformers puts on that module. The experts run on
sonicmoe.moe_routed (the kernels for bf16 CUDA tensors, sonicmoe.reference on CPU);
gradients flow into the router's scores. Shared experts and their gates stay as they are.

The experts' act_fn picks the gated activation: SiLU runs as SwiGLU, GELU's tanh form
(transformers' GELUTanh, "gelu_pytorch_tanh", NewGELUActivation, "gelu_new", FastGELUActivation,
"gelu_fast", or nn.GELU(approximate="tanh")) as GeGLU, ReLU as ReGLU (sonicmoe.moe_routed's
activation=). Blocks of other classes, subclasses, or known classes in a form this mapping does
not cover (another activation, such as exact-erf GELU, a transposed or biased expert layout,
hooks on the block, expert parallelism) are left untouched and listed in the report.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

try:
    import transformers as _transformers
except ImportError as err:  # the core never needs transformers; this module does
    raise ImportError(
        "sonicmoe.integrations.transformers needs the Hugging Face `transformers` package "
        "(pip install 'transformers>=5.17,<6'); it is not installed") from err

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import FastGELUActivation, GELUTanh, NewGELUActivation, SiLUActivation

from ..functional import moe_routed

if int(_transformers.__version__.split(".")[0]) < 5:
    # 4.x keeps experts as a ModuleList of MLPs and returns router logits from the block.
    raise ImportError(f"sonicmoe.integrations.transformers needs transformers>=5 (fused expert weights); "
                      f"found transformers {_transformers.__version__}")

__all__ = ["SonicMoeBlock", "SonicMoeExperts", "SwapReport", "replace_moe_blocks"]


@dataclass(frozen=True)
class _Family:
    name: str
    module: str  # the modeling module that defines the three classes
    block: str
    router: str
    experts: str
    forward: str  # which of SonicMoeBlock's forwards mirrors the block's


_FAMILIES = tuple(
    _Family(name, f"transformers.models.{pkg}.modeling_{pkg}", block, router, experts, forward)
    for name, pkg, block, router, experts, forward in (
        ("qwen3_moe", "qwen3_moe", "Qwen3MoeSparseMoeBlock", "Qwen3MoeTopKRouter", "Qwen3MoeExperts", "plain"),
        ("qwen2_moe", "qwen2_moe", "Qwen2MoeSparseMoeBlock", "Qwen2MoeTopKRouter", "Qwen2MoeExperts",
         "gated_shared"),
        ("olmoe", "olmoe", "OlmoeSparseMoeBlock", "OlmoeTopKRouter", "OlmoeExperts", "plain"),
        ("mixtral", "mixtral", "MixtralSparseMoeBlock", "MixtralTopKRouter", "MixtralExperts", "jitter"),
        ("deepseek_v3", "deepseek_v3", "DeepseekV3MoE", "DeepseekV3TopkRouter", "DeepseekV3Experts",
         "shared"),
    ))
# Matched on the exact class (module and name), never a subclass: a subclass may change forward.
_BY_CLASS = {(f.module, f.block): f for f in _FAMILIES}

# Class names that read as a sparse-MoE block (Qwen3MoeSparseMoeBlock, DeepseekV3MoE, ...), for
# listing unknown blocks; a module holding an `experts` child counts too.
_MOE_BLOCK_NAME = re.compile(r"(SparseMoe|SparseMoE|MoE|MoeBlock|MoEBlock|MoeLayer|MoELayer)$")


def _class_key(module):
    cls = type(module)
    return cls.__module__, cls.__qualname__


def _routing(family, gate):
    """The router's rule in docs/design.md §2's words (sonicmoe's routing modes where one matches)."""
    if family.name == "mixtral":
        return "topk_softmax"  # softmax over E, top-K, renormalised: the softmax over the K chosen
    if family.name == "deepseek_v3":
        return (f"sigmoid + e_score_correction_bias, group-limited top-K (n_group={gate.num_group}, "
                f"topk_group={gate.topk_group}), norm_topk_prob={gate.norm_topk_prob}, "
                f"routed_scaling_factor={gate.routed_scaling_factor}")
    return "softmax_topk_norm" if gate.norm_topk_prob else "softmax_topk"


def _activation(act_fn):
    """sonicmoe's gated activation for an experts' act_fn module, or None where none matches:
    SiLU -> "swiglu"; GELU's tanh form, 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), whichever
    class computes it -> "geglu"; ReLU -> "reglu". Exact classes only (a subclass may change forward)."""
    kind = type(act_fn)
    if kind in (nn.SiLU, SiLUActivation):
        return "swiglu"
    if kind in (GELUTanh, NewGELUActivation, FastGELUActivation) or (
            kind is nn.GELU and getattr(act_fn, "approximate", "none") == "tanh"):
        return "geglu"
    if kind is nn.ReLU:
        return "reglu"
    return None


def _why_not(block, family):
    """Why this block of a known class cannot be swapped exactly, or None if it can."""
    gate, experts = getattr(block, "gate", None), getattr(block, "experts", None)
    if gate is None or _class_key(gate) != (family.module, family.router):
        return f"its gate is {type(gate).__name__}, not {family.router}"
    if experts is None or _class_key(experts) != (family.module, family.experts):
        return f"its experts are {type(experts).__name__}, not {family.experts}"
    # The expert layout use_experts_implementation declares; SonicMoE's w1 is concatenated, untransposed.
    for attr, want in (("is_transposed", False), ("is_concatenated", True), ("has_bias", False),
                       ("has_gate", True), ("has_post_expert_norm", False), ("_is_expert_parallel", False)):
        if getattr(experts, attr, want) != want:
            return f"experts.{attr} = {getattr(experts, attr)} (SonicMoE needs {want})"
    if _activation(getattr(experts, "act_fn", None)) is None:
        act_fn = getattr(experts, "act_fn", None)
        name = type(act_fn).__name__ + (f"(approximate={act_fn.approximate!r})" if isinstance(act_fn, nn.GELU) else "")
        return (f"experts.act_fn is {name} (SonicMoE's experts are gated: SiLU as SwiGLU, GELU's tanh form as "
                "GeGLU, ReLU as ReGLU)")
    w1, w2 = experts.gate_up_proj, experts.down_proj
    if not (isinstance(w1, nn.Parameter) and isinstance(w2, nn.Parameter)) or w1.dim() != 3 or w2.dim() != 3:
        return "experts.gate_up_proj / down_proj are not 3-D Parameters"
    E, d, n = w2.shape
    if w1.shape != (E, 2 * n, d):
        return f"experts.gate_up_proj.shape = {tuple(w1.shape)}, expected (E, 2n, d) = {(E, 2 * n, d)}"
    if w1.dtype != w2.dtype or w1.device != w2.device:
        return "experts.gate_up_proj and down_proj differ in dtype or device"
    for module, what in ((block, "block"), (experts, "experts")):
        if module._forward_hooks or module._forward_pre_hooks or "forward" in module.__dict__:
            return f"the {what} has forward hooks or a patched forward (e.g. accelerate offloading)"
    return None


class SonicMoeExperts(nn.Module):
    """The model's expert weights under their own names (the same Parameter objects), run by
    sonicmoe.moe_routed with the activation of the experts' act_fn (_activation). Same call as
    transformers' experts: (hidden_states (T, d), top_k_index (T, K), top_k_weights (T, K)) ->
    (T, d) in hidden_states' dtype."""

    def __init__(self, experts):
        super().__init__()
        self.num_experts, self.hidden_dim, self.intermediate_dim = experts.down_proj.shape
        self.activation = _activation(experts.act_fn)
        self.gate_up_proj = experts.gate_up_proj  # (E, 2n, d): sonicmoe's w1 as it is
        self.down_proj = experts.down_proj  # (E, d, n): sonicmoe's w2 as it is

    def forward(self, hidden_states, top_k_index, top_k_weights):
        out = moe_routed(hidden_states, self.gate_up_proj, self.down_proj, top_k_weights, top_k_index,
                         activation=self.activation)
        return out.to(hidden_states.dtype)

    def extra_repr(self):
        return (f"num_experts={self.num_experts}, hidden_dim={self.hidden_dim}, "
                f"intermediate_dim={self.intermediate_dim}, activation={self.activation!r}")


class SonicMoeBlock(nn.Module):
    """A transformers sparse-MoE block with its experts on SonicMoE.

    Children keep the original block's names and order (gate, experts, shared expert(s) and
    their gate), so parameter names and state_dict keys are unchanged. forward(hidden_states
    (B, S, d)) -> (B, S, d), as the original block; the router logits go, as before, through
    the gate module's output hooks.
    """

    def __init__(self, block, family, routing):
        super().__init__()
        self.family = family.name
        self.routing = routing
        self._forward_kind = family.forward
        self.original_class = f"{family.module}.{family.block}"
        for name, child in block.named_children():
            setattr(self, name, SonicMoeExperts(child) if name == "experts" else child)
        # Plain attributes the family's forward reads (Mixtral's jitter) or callers may read.
        for attr in ("top_k", "jitter_noise", "config"):
            if attr in block.__dict__:
                setattr(self, attr, block.__dict__[attr])
        self.training = block.training

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        kind = self._forward_kind
        batch_size, sequence_length, hidden_dim = hidden_states.shape
        if kind == "shared":  # DeepseekV3MoE
            _, weights, experts = self.gate(hidden_states)
            out = self.experts(hidden_states.view(-1, hidden_dim), experts, weights)
            return out.view(hidden_states.shape) + self.shared_experts(hidden_states)
        if kind == "jitter" and self.training and self.jitter_noise > 0:
            # Mixtral scales its input in place; out of place here: the same values and RNG draws.
            hidden_states = hidden_states * torch.empty_like(hidden_states).uniform_(
                1.0 - self.jitter_noise, 1.0 + self.jitter_noise)
        x = hidden_states.view(-1, hidden_dim)
        shared = self.shared_expert(x) if kind == "gated_shared" else None  # Qwen2-MoE's order of calls
        _, weights, experts = self.gate(x)
        out = self.experts(x, experts, weights)
        if shared is not None:
            out = out + F.sigmoid(self.shared_expert_gate(x)) * shared
        return out.reshape(batch_size, sequence_length, hidden_dim)

    def extra_repr(self):
        return f"family={self.family!r}, routing={self.routing!r}"


@dataclass
class SwapReport:
    """What replace_moe_blocks did: swapped, a list of (module name, family, routing); left_alone,
    a list of (module name, class name, reason) for MoE-like blocks it did not touch."""

    swapped: list = field(default_factory=list)
    left_alone: list = field(default_factory=list)

    def __str__(self):
        lines = [f"SonicMoE swapped {len(self.swapped)} block(s), left {len(self.left_alone)} alone"]
        lines += [f"  swapped {name}: {family} ({routing})" for name, family, routing in self.swapped]
        lines += [f"  left alone {name}: {cls} ({reason})" for name, cls, reason in self.left_alone]
        return "\n".join(lines)


def _looks_like_moe(module):
    return "experts" in module._modules or bool(_MOE_BLOCK_NAME.search(type(module).__name__))


def replace_moe_blocks(model: nn.Module, *, families=None, strict: bool = False) -> SwapReport:
    """Swap every sparse-MoE block of `model` for a SonicMoeBlock with the same weights, in place.

    families: names to swap (default all: "qwen3_moe", "qwen2_moe", "olmoe", "mixtral",
    "deepseek_v3"); blocks of other covered families are then left alone and listed.
    strict: raise ValueError, before changing anything, if any MoE-like block would be left alone.
    Every block is checked before any is swapped, so the model is never half converted.
    Returns a SwapReport. Calling it again swaps nothing (SonicMoeBlocks are skipped).
    """
    known = {f.name for f in _FAMILIES}
    wanted = known if families is None else set(families)
    if wanted - known:
        raise ValueError(f"families = {sorted(wanted - known)} breaks the rule: must be among {sorted(known)}")
    report, plan, memo = SwapReport(), [], {}

    def visit(parent, prefix):
        for child_name, child in parent.named_children():
            name = f"{prefix}.{child_name}" if prefix else child_name
            if isinstance(child, SonicMoeBlock):
                continue
            family = _BY_CLASS.get(_class_key(child))
            if family is not None:
                reason = (_why_not(child, family) if family.name in wanted
                          else f"family {family.name!r} not in families")
                if reason is None:
                    plan.append((parent, child_name, name, child, family))
                else:
                    report.left_alone.append((name, type(child).__qualname__, reason))
                continue
            if _looks_like_moe(child):
                report.left_alone.append((name, type(child).__qualname__, "not a block this integration knows"))
                continue
            visit(child, name)

    visit(model, "")
    if strict and report.left_alone:
        raise ValueError(f"replace_moe_blocks(strict=True): {len(report.left_alone)} MoE-like block(s) would be "
                         f"left alone:\n{report}")
    for parent, child_name, name, block, family in plan:
        if id(block) not in memo:  # a block reached twice (tied modules) stays one block
            memo[id(block)] = SonicMoeBlock(block, family, _routing(family, block.gate))
        setattr(parent, child_name, memo[id(block)])
        report.swapped.append((name, family.name, memo[id(block)].routing))
    return report
