"""sonicmoe.moe / sonicmoe.moe_routed: the MoE layer as functions, with autograd.

Forward on a Hopper GPU (bf16): routing metadata on the device, the up-projection with the
x gather and SwiGLU fused in (K1), the down-projection (K2), combine (K3). No gathered copy
of x and no separate activation pass exist, and nothing syncs with the host, so the forward
can be captured in a CUDA graph.

Interim, until the backward issue lands (README, Status): backward recomputes the layer
through sonicmoe.reference (plain PyTorch autograd in the inputs' dtype): right, but neither
fast nor lean. It does not read H (the pre-activation), so the forward does not keep it yet;
the memory-lean backward will (up_proj(keep_h=True)).

CPU tensors run sonicmoe.reference (the same math in plain PyTorch).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import reference
from ._ops import combine, extension_available, grouped_gemm, up_proj
from .routing import routing_metadata, scores_from_logits

__all__ = ["moe", "moe_routed"]


def _shape(t):
    return tuple(t.shape)


def _check_one_device(*tensors):
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise ValueError(f"x, w1, w2, scores, experts: expected one device, got {sorted(map(str, devices))}")


def _kernel_path(x, w1, w2) -> bool:
    """True for the CUDA kernels, False for the CPU reference; raises where neither applies."""
    if x.device.type == "cpu":
        return False
    if x.device.type != "cuda":
        raise ValueError(f"x.device = {x.device} breaks the rule: must be cuda or cpu")
    if not extension_available():
        raise RuntimeError("sonicmoe._C is not built; build it with `python setup.py build_ext --inplace`")
    for name, t in (("x", x), ("w1", w1), ("w2", w2)):
        if t.dtype != torch.bfloat16:
            raise ValueError(f"{name}.dtype = {t.dtype} breaks the rule: must be torch.bfloat16 "
                             "on CUDA (the kernels are bf16; CPU tensors run the reference)")
    for name, t in (("w1", w1), ("w2", w2)):
        if not t.is_contiguous():
            raise ValueError(f"{name}.stride() = {t.stride()} breaks the rule: must be contiguous "
                             "(the layout of DESIGN §2); call .contiguous() once, not per step")
    d, n = x.shape[1], w2.shape[2]
    for name, v in (("d", d), ("n", n)):
        if v % 8:
            raise ValueError(f"{name} = {v} breaks the rule: must be a multiple of 8 (16-byte rows)")
    return True


class _MoEExperts(torch.autograd.Function):
    """Expert MLPs and combine for given routing; see the module docstring for the interim parts."""

    @staticmethod
    def forward(ctx, x, w1, w2, scores, experts):
        meta = routing_metadata(experts, w2.shape[0])
        # No H: the interim backward recomputes instead of reading it.
        _, a = up_proj(x, w1, meta.expert_offsets, meta.gather_idx, keep_h=False)
        y = grouped_gemm(a, w2, meta.expert_offsets)
        ctx.save_for_backward(x, w1, w2, scores, experts)
        return combine(y, scores, meta.rev_idx)

    @staticmethod
    def backward(ctx, grad_out):
        x, w1, w2, scores, experts = ctx.saved_tensors
        inputs = (x, w1, w2, scores)
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_(need) for t, need in zip(inputs, ctx.needs_input_grad)]
            out = reference.moe_routed(*leaves, experts)
            wanted = [t for t in leaves if t.requires_grad]
            grads = iter(torch.autograd.grad(out, wanted, grad_out.to(out.dtype)) if wanted else [])
        result = [next(grads).to(t.dtype) if need else None
                  for t, need in zip(inputs, ctx.needs_input_grad)]
        return (*result, None)


def moe_routed(x, w1, w2, scores, experts):
    """Expert MLPs (SwiGLU) for any router's decisions; gradients flow into scores.

    x: (T, d); w1: (E, 2n, d), rows [0, n) gate and [n, 2n) up; w2: (E, d, n);
    scores: (T, K) (fp32 recommended; the kernels combine in fp32); experts: (T, K) integer
    ids in [0, E) (not range-checked on the device: that would sync). Returns (T, d).
    """
    reference.check_routed_args(x, w1, w2, scores, experts)
    _check_one_device(x, w1, w2, scores, experts)
    if not _kernel_path(x, w1, w2):
        return reference.moe_routed(x, w1, w2, scores.to(x.dtype), experts)
    return _MoEExperts.apply(x, w1, w2, scores.float(), experts)


def moe(x, router_weight, w1, w2, top_k, *, routing="topk_softmax", tile=128, rule="nearest"):
    """Full MoE layer: router, routing, expert MLPs, combine.

    x: (..., d); router_weight: (E, d) (logits = x @ router_weight.T, then softmax and top-K in
    fp32); routing: "topk_softmax", "softmax_topk", "softmax_topk_norm" or "token_rounding"
    (tile-aware rounding of each expert's token count to a multiple of `tile`, by `rule`
    "nearest", "up" or "down"; DESIGN §6). Returns x's shape.
    """
    reference._check_routing(routing, dense_ok=True)
    d = x.shape[-1]
    if router_weight.dim() != 2 or router_weight.shape[1] != d:
        raise ValueError(f"router_weight: expected shape (E, d) with d = {d}, got {_shape(router_weight)}")
    top_k = reference._check_top_k(top_k, router_weight.shape[0])
    if routing == "token_rounding":
        if x.device.type != "cpu":
            raise NotImplementedError(
                "routing='token_rounding' runs on the reference path only for now (CPU tensors, "
                "or sonicmoe.reference.moe); the kernels take (T, K) routing until the "
                "token-rounding issue lands its variable-K metadata")
        return reference.moe(x, router_weight, w1, w2, top_k, routing, tile=tile, rule=rule)
    x2 = x.reshape(-1, d)
    logits = F.linear(x2, router_weight).float()
    scores, experts = scores_from_logits(logits, top_k, routing)
    return moe_routed(x2, w1, w2, scores, experts).reshape(x.shape)
