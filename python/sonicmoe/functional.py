"""sonicmoe.moe / sonicmoe.moe_routed: the MoE layer as functions, with autograd.

Forward on a Hopper GPU (bf16): routing metadata on the device, the up-projection with the
x gather and SwiGLU fused in (K1), the down-projection (K2), combine (K3). No gathered copy
of x and no separate activation pass exist, and nothing syncs with the host, so the forward
can be captured in a CUDA graph.

Backward (WIP, not yet run on a GPU): K4, K6 and K8 from x, H, the scores and the metadata;
the weight gradients go through torch._grouped_mm over gathered copies until K5/K7 exist.

CPU tensors run sonicmoe.reference (the same math in plain PyTorch).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import reference
from ._ops import (combine, combine_csr, device_routing_metadata, down_proj_grad, extension_available,
                   grouped_gemm, grouped_gemm_kn, router_topk, up_proj)
from .routing import dense_routing_metadata, dense_row_bound, scores_from_logits, token_rounding

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
    """Expert MLPs and combine for given routing.

    Saves x, H, the scores and the int32 routing metadata (the weights are the caller's
    parameters). Backward: K4 (dO gathered in the load, dSwiGLU and dS from H), K6 (dH @ w1),
    K8 (gather-and-sum by combine). Interim until K5/K7: the weight gradients are
    torch._grouped_mm over gathered copies of dO and x."""

    @staticmethod
    def forward(ctx, x, w1, w2, scores, experts):
        meta = device_routing_metadata(experts, w2.shape[0])
        keep_h = any(ctx.needs_input_grad)
        h, a = up_proj(x, w1, meta.expert_offsets, meta.gather_idx, keep_h=keep_h)
        y = grouped_gemm(a, w2, meta.expert_offsets)
        ctx.save_for_backward(x, w1, w2, scores, h, *meta)
        return combine(y, scores, meta.rev_idx)

    @staticmethod
    def backward(ctx, grad_out):
        x, w1, w2, scores, h, offsets, gather_idx, rev_idx = ctx.saved_tensors
        need_x, need_w1, need_w2, need_scores, _ = ctx.needs_input_grad
        rows = rev_idx.reshape(-1).long()
        row_score = scores.new_empty(gather_idx.shape[0])
        row_score[rows] = scores.reshape(-1)
        d_out = grad_out.to(torch.bfloat16).contiguous()
        d_h, a_scaled, d_score_partial = down_proj_grad(d_out, w2, h, row_score, offsets, gather_idx)
        dscores = d_score_partial.sum(dim=1)[rows].view(scores.shape) if need_scores else None
        dx = None
        if need_x:
            dx_rows = grouped_gemm_kn(d_h, w1, offsets)
            dx = combine(dx_rows, torch.ones_like(scores), rev_idx).to(x.dtype)
        has_rows = (offsets[1:] > offsets[:-1]).view(-1, 1, 1)
        ends = offsets[1:]
        dw1 = dw2 = None
        if need_w2:  # interim (K5): gathered copy of dO
            dw2 = torch._grouped_mm(d_out[gather_idx.long()].t(), a_scaled, offs=ends)
            dw2 = torch.where(has_rows, dw2, torch.zeros((), dtype=dw2.dtype, device=dw2.device))
        if need_w1:  # interim (K7): gathered copy of x
            dw1 = torch._grouped_mm(d_h.t(), x[gather_idx.long()], offs=ends)
            dw1 = torch.where(has_rows, dw1, torch.zeros((), dtype=dw1.dtype, device=dw1.device))
        return dx, dw1, dw2, dscores, None


class _MoEDenseExperts(torch.autograd.Function):
    """Expert MLPs and combine for a dense (T, E) assignment (token rounding) on the kernels: the
    sorted layout lives in upper-bound buffers (the row count is known only on the device), K1 and
    K2 run with partial_rows, combine walks each token's entries. Interim backward: recomputes
    through sonicmoe.reference.moe_dense_routed."""

    @staticmethod
    def forward(ctx, x, w1, w2, scores, assigned, top_k, tile):
        T, E = assigned.shape
        meta = dense_routing_metadata(scores, assigned, dense_row_bound(T, E, top_k, tile))
        _, a = up_proj(x, w1, meta.expert_offsets, meta.gather_idx, keep_h=False, partial_rows=True)
        y = grouped_gemm(a, w2, meta.expert_offsets, tile_config="varlen_pingpong_128x128x64",
                         partial_rows=True)
        ctx.save_for_backward(x, w1, w2, scores, assigned)
        return combine_csr(y, meta.row_scores, meta.rows, meta.token_offsets)

    @staticmethod
    def backward(ctx, grad_out):
        x, w1, w2, scores, assigned = ctx.saved_tensors
        inputs = (x, w1, w2, scores)
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_(need) for t, need in zip(inputs, ctx.needs_input_grad)]
            out = reference.moe_dense_routed(leaves[0], leaves[1], leaves[2], leaves[3].to(x.dtype), assigned)
            wanted = [t for t in leaves if t.requires_grad]
            grads = iter(torch.autograd.grad(out, wanted, grad_out.to(out.dtype)) if wanted else [])
        result = [next(grads).to(t.dtype) if need else None for t, need in zip(inputs, ctx.needs_input_grad)]
        return (*result, None, None, None)


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
        if x.device.type == "cpu" or not _kernel_path(x, w1, w2):
            return reference.moe(x, router_weight, w1, w2, top_k, routing, tile=tile, rule=rule)
        x2 = x.reshape(-1, d)
        scores, assigned = token_rounding(F.linear(x2, router_weight).float(), top_k, tile, rule)
        return _MoEDenseExperts.apply(x2, w1, w2, scores, assigned, top_k, tile).reshape(x.shape)
    x2 = x.reshape(-1, d)
    logits = F.linear(x2, router_weight)
    if x2.is_cuda and extension_available() and router_weight.shape[0] <= 1024 and top_k <= 32:
        scores, experts = _RouterTopK.apply(logits, top_k, routing)
    else:
        scores, experts = scores_from_logits(logits.float(), top_k, routing)
    return moe_routed(x2, w1, w2, scores, experts).reshape(x.shape)


class _RouterTopK(torch.autograd.Function):
    """R: top-K choice and fp32 scores in one kernel; backward in PyTorch (T x E, small).

    topk_softmax and softmax_topk_norm are both the softmax over the chosen logits; softmax_topk
    is the full softmax at the chosen experts."""

    @staticmethod
    def forward(ctx, logits, top_k, routing):
        scores, experts = router_topk(logits, top_k, routing)
        ctx.mark_non_differentiable(experts)
        ctx.save_for_backward(logits, scores, experts)
        ctx.routing = routing
        return scores, experts

    @staticmethod
    def backward(ctx, grad_scores, _grad_experts):
        logits, scores, experts = ctx.saved_tensors
        grad = router_scores_backward(logits, scores, experts, grad_scores, ctx.routing)
        return grad.to(logits.dtype), None, None


def router_scores_backward(logits, scores, experts, grad_scores, routing):
    """d(loss)/d(logits) (T, E) fp32 from d(loss)/d(scores) (T, K) of a top-K router."""
    idx = experts.long()
    weighted = grad_scores.float() * scores.float()
    if routing == "softmax_topk":
        probs = logits.float().softmax(dim=-1)
        grad = torch.zeros_like(probs).scatter_(1, idx, weighted)
        return grad - probs * weighted.sum(dim=-1, keepdim=True)
    chosen = weighted - scores.float() * weighted.sum(dim=-1, keepdim=True)
    return logits.new_zeros(logits.shape, dtype=torch.float32).scatter_(1, idx, chosen)
