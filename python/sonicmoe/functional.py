"""sonicmoe.moe / sonicmoe.moe_routed: the MoE layer as functions, with autograd.

Forward on a Hopper or Blackwell GPU (bf16): routing metadata on the device, the up-projection with the
x gather and the gated activation (activation=: SwiGLU, GeGLU or ReGLU) fused in (K1), the
down-projection (K2), combine (K3). No gathered copy of x and no separate activation pass exist,
and nothing syncs with the host, so the forward can be captured in a CUDA graph.

Backward: K4, K6 and K8 from x, H, the scores and the metadata; the weight gradients on our
K5/K7 (weight_grad) where they outrun torch._grouped_mm over gathered copies, which eager mode
uses elsewhere; compiled graphs run K5/K7 (see _experts_backward). Where 512 <= n <= 1024 the
eager top-K backward runs its tail (K8 and the router's part) on a second stream beside K5 / K7,
which leave it a few SMs (_TAIL_SM_MARGIN). sonicmoe.moe's top-K layer is one autograd Function
(_MoELayer), whose backward starts K8's sum from the router's part of dx.
Token rounding runs the same kernels over a dense (T, E) assignment with partial_rows.

CPU tensors run sonicmoe.reference (the same math in plain PyTorch).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import _ops, reference
from ._ops import (ROUTER_MAX_EXPERTS, ROUTER_MAX_TOP_K, check_activation, combine, combine_csr, combine_dx,
                   device_routing_metadata, down_proj_grad, extension_available, grouped_gemm, grouped_gemm_kn,
                   on_kernels, router_backward, router_backward_rows, router_topk, scatter_rows, up_proj, weight_grad)
from .routing import (_INT32_MAX, dense_routing_metadata_expert_major, dense_row_bound, routing_metadata,
                      scores_from_logits, token_rounding_expert_major)

__all__ = ["moe", "moe_routed"]


def _shape(t):
    return tuple(t.shape)


def _check_one_device(names, *tensors):
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise ValueError(f"{names}: expected one device, got {sorted(map(str, devices))}")


def _autocast_inputs(x, *tensors):
    """torch.autocast's rule at the layer's entry, as nn.Linear follows it: under autocast on x's
    device, x and the weights run in the autocast dtype and their gradients flow back through the
    casts to the caller's (e.g. fp32 master) tensors. The casts are copies per call, kept for
    backward like autocast's own (weights in bf16 copy nothing). The CUDA kernels are bf16 only,
    so CUDA autocast must be bfloat16. Outside autocast nothing is cast. Scores are not passed
    here: they stay fp32 (the kernels combine in fp32)."""
    device_type = x.device.type
    if device_type not in ("cuda", "cpu") or not torch.is_autocast_enabled(device_type):
        return (x, *tensors)
    dtype = torch.get_autocast_dtype(device_type)
    if device_type == "cuda" and dtype != torch.bfloat16:
        raise ValueError(f"torch.autocast dtype = {dtype} breaks the rule: must be torch.bfloat16 on CUDA "
                         "(the kernels are bf16)")
    return tuple(t.to(dtype) if t.is_floating_point() else t for t in (x, *tensors))


def _kernel_rows(t):
    """t as rows the kernels can read: contiguous and 16-byte aligned, copied only where it is not
    (a transposed or sliced view); its gradient flows back to t."""
    if not t.is_contiguous():
        return t.contiguous()
    if (t.device.type in _ops.KERNEL_DEVICE_TYPES and t.numel() and not torch.compiler.is_compiling()
            and t.data_ptr() % 16):  # Inductor copies its misaligned inputs itself
        return t.clone()
    return t


def _token_rows(x, d):
    """x as (T, d) rows the kernels can read (_kernel_rows)."""
    return _kernel_rows(x.reshape(-1, d))


# The compute capabilities the layer runs on, by the archs this build holds (kernel_archs(),
# SONICMOE_CUDA_ARCHS): Hopper sm_90 with sm_90a kernels, Blackwell sm_100 (B200, GB200) with
# sm_100a ones (an 'a' cubin loads on its exact compute capability only). Checked once per device
# before anything is launched; the ops check in C++ as well (csrc/torch/checks.h).
_ARCH_CAPABILITIES = {90: (9, 0), 100: (10, 0)}
_device_families = {}  # device index -> 90 or 100, for the devices checked


def _kernel_device_rule(major, minor, archs):
    """Why a GPU of compute capability major.minor cannot run the layer, for a build of archs."""
    names = {90: "Hopper (sm_90: H100, H200)", 100: "Blackwell (sm_100: B200, GB200)"}
    built = [a for a in (90, 100) if a in archs]
    rule = ("must be " + " or ".join(names[a] for a in built)) if built else "needs a build with GPU kernels"
    holds = f"this build has {' and '.join(f'sm_{a}a' for a in built) or 'no'} kernels"
    if (major, minor) in _ARCH_CAPABILITIES.values():  # a family this build lacks
        return f"{rule}; {holds}: rebuild with SONICMOE_CUDA_ARCHS=\"90a;100a\""
    if major == 10:
        return f"{rule}; sm_{major}{minor} is not sm_100: sm_100a kernels load on compute capability 10.0 only"
    return f"{rule}; {holds}"


def _cuda_index(device):
    """A CUDA device's index (the current device's where it names none)."""
    return device.index if device.index is not None else torch.cuda.current_device()


def _check_kernel_device(device):
    index = _cuda_index(device)
    if index in _device_families:
        return
    major, minor = torch.cuda.get_device_capability(index)
    archs = _ops.kernel_archs()
    family = next((a for a in archs if _ARCH_CAPABILITIES.get(a) == (major, minor)), None)
    if family is None:
        raise ValueError(f"x.device = {device} (sm_{major}{minor}) breaks the rule: "
                         + _kernel_device_rule(major, minor, archs))
    _device_families[index] = family


def _on_blackwell(device) -> bool:
    """Whether a device runs the sm_100a kernels (a CUDA device of compute capability 10.0)."""
    if device.type != "cuda":
        return False  # the CPU emulation of the kernel path (tests)
    index = _cuda_index(device)
    family = _device_families.get(index)
    return family == 100 if family is not None else torch.cuda.get_device_capability(index) == (10, 0)


def _check_kernel_top_k(name, top_k, num_tokens):
    """The top-K layer's combines (K3, K8) hold a token's K pairs in one warp's lanes, and every
    kernel indexes the T·K sorted rows in int32."""
    if top_k > ROUTER_MAX_TOP_K:
        raise ValueError(f"{name} = {top_k} breaks the rule: must be <= {ROUTER_MAX_TOP_K} on the kernels (one "
                         "warp's lanes hold a token's top-K pairs); token rounding takes any top_k")
    if num_tokens * top_k > _INT32_MAX:
        raise ValueError(f"T * top_k = {num_tokens * top_k} breaks the rule: must be <= 2^31 - 1 (the kernels' "
                         "int32 row indices)")


def _kernel_path(x, w1, w2) -> bool:
    """True for the CUDA kernels, False for the CPU reference; raises where neither applies."""
    if x.device.type not in _ops.KERNEL_DEVICE_TYPES:
        if x.device.type == "cpu":
            return False
        raise ValueError(f"x.device = {x.device} breaks the rule: must be cuda or cpu")
    if not extension_available():
        raise RuntimeError("sonicmoe._C is not built; build it with `python setup.py build_ext --inplace`")
    if x.device.type == "cuda" and not torch.compiler.is_compiling():  # compiled calls: the ops check
        _check_kernel_device(x.device)
    for name, t in (("x", x), ("w1", w1), ("w2", w2)):
        if t.dtype != torch.bfloat16:
            raise ValueError(f"{name}.dtype = {t.dtype} breaks the rule: must be torch.bfloat16 "
                             "on CUDA (the kernels are bf16; CPU tensors run the reference): keep the "
                             "parameters in bf16 or call the layer under torch.autocast('cuda', "
                             "dtype=torch.bfloat16)")
    for name, t in (("w1", w1), ("w2", w2)):
        if not t.is_contiguous():
            raise ValueError(f"{name}.stride() = {t.stride()} breaks the rule: must be contiguous "
                             "(the layout of docs/design.md §2); call .contiguous() once, not per step")
        if t.numel() and not torch.compiler.is_compiling() and t.data_ptr() % 16:
            raise ValueError(f"{name}.data_ptr() = {t.data_ptr()} breaks the rule: must be 16-byte aligned "
                             "(TMA; a view into a flat buffer may not be); copy it once, not per step")
    d, n = x.shape[1], w2.shape[2]
    for name, v in (("d", d), ("n", n)):
        if v <= 0 or v % 8:
            raise ValueError(f"{name} = {v} breaks the rule: must be a positive multiple of 8 (16-byte rows)")
    return True


def _grad_enabled_for(*tensors) -> bool:
    """Whether this forward builds a graph: only then is H worth writing and keeping."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _dw1_on_k7(n: int, device=None) -> bool:
    """Eager dW1 on K7 (K5's 128 x 256 tile with x gathered on its 128-wide side, stored transposed)
    rather than a copy of x in the sorted layout (_x_in_sorted_rows) + torch._grouped_mm: where n <=
    1024, and at n >= 2048. Timed as the layer's backward on the H200, the copy then gathered
    (scattered since: 0.62x the gather's time, H100): K7 ran 1-4% faster at n 512 and 1024
    (paper-30b-n512, paper-7b-n1024, qwen3-30b-a3b) and level at olmoe-1b-7b and paper-120b-n1024;
    the copy path won by 1.4% at n 1536 (qwen3-235b-a22b, 2048 rows an expert); at n 2048
    (deepseek-v3, 512 rows an expert) K7's TMA stores, which drain behind the next tile, made it 1%
    faster. K7 also spares the copy (T K d bf16) at the step's peak. Token rounding's buffers take
    the same rule (there the copy path took 858 µs where K5 + K7 took 490 at T 16384, d 1536, n 256,
    E 64). docs/performance.md has the table. On Blackwell (device) always: there torch._grouped_mm
    leaves an empty group's gradient unwritten (pytorch/pytorch#172439)."""
    return n <= 1024 or n >= 2048 or (device is not None and _on_blackwell(device))


# The backward's tail (K8, R's backward and the router's GEMMs: memory-bound, ~0.45 ms at
# olmoe-1b-7b) reads K4's and K6's outputs only, so it runs on a second stream beside K5 / K7,
# which leave it _TAIL_SM_MARGIN SMs (their persistent grids take every SM otherwise). Measured as
# the layer's backward in the anchors' protocol on the H200, against the tail after K5 / K7: +0.1
# to +1.8% where 512 <= n <= 1024; where n < 512 the GEMMs are too short to hide it (-0.3 / -0.9%
# at paper-7b-n256), at n 1536 / 2048 no gain; 8 SMs read -2.8 to +1.2%, 16 lost everywhere.
_TAIL_SM_MARGIN = 4
_side_streams_by_device = {}


def _tail_beside_weight_grads(x, n, partial_rows) -> bool:
    """Whether the backward's tail runs on a second stream beside K5 / K7 (see _TAIL_SM_MARGIN):
    eager CUDA only (a compiled graph keeps one stream), the top-K layouts (token rounding's was
    not measured), 512 <= n <= 1024."""
    return x.is_cuda and not torch.compiler.is_compiling() and not partial_rows and 512 <= n <= 1024


def _side_streams(device):
    """(K5 / K7's stream, the tail's stream) on device, made once: K5 / K7 at a higher priority,
    so that their CTAs take the SMs first and the tail gets what they leave."""
    key = _cuda_index(device)
    if key not in _side_streams_by_device:
        _side_streams_by_device[key] = (torch.cuda.Stream(device, priority=-1), torch.cuda.Stream(device, priority=0))
    return _side_streams_by_device[key]


def _x_in_sorted_rows(x, gather_idx, rev_idx):
    """x's rows in the sorted layout (row r is x[gather_idx[r]]), dW1's operand on the copy path.
    Where rev_idx (T, K) maps every (t, k) to its sorted row (the top-K layouts: each row once),
    scattered (scatter_rows): each row of x read once and written to its K rows, where a gather
    reads it K times, from memory once x outgrows L2 (qwen3-235b-a22b: 2.4 against 4.3 GB moved).
    torch's index_put_ does the same move at 0.5 TB/s against the gather's 3.0 (H100)."""
    if rev_idx is None:
        return x[gather_idx.long()]
    return scatter_rows(x, rev_idx)


def _experts_backward(needs, grad_out, x, w1, w2, h, row_score, offsets, gather_idx, partial_rows, tail,
                      k6_addend=None, activation="swiglu", rev_idx=None):
    """The kernels' backward over the sorted layout, shared by the top-K and dense layers.

    K4 gathers dO by gather_idx, recomputes A from H and returns dH, A' = s*A and the per-row
    score gradient; K6 gives dX~ = dH @ w1 per row.

    The weight gradients: our K5/K7 (weight_grad, the gather inside the loads) on cooperative
    tiles, or for dW1 torch._grouped_mm over a copy of x in the sorted layout, whichever measured
    faster on the H200 (docs/performance.md): dW2 on K5 at every n, dW1 on K7 except at
    1024 < n < 2048 (_dw1_on_k7), timed as the layer's backward. With token rounding's
    buffers (partial_rows) the cooperative tiles' TMA side reads up to a box of rows past
    offsets[E], which down_proj_grad zeroes in d_h and A'. Under torch.compile the interim path
    cannot stay: Inductor stores the gathered copy K-contiguous, where torch._grouped_mm needs
    every group's row count to be a multiple of 8 (a device-side assert otherwise), so compiled
    graphs run K5/K7.
    needs: which of (dx_rows, dw1, dw2, d_score_partial) to compute.
    tail(dx_rows, d_score_partial): the caller's work on K6's dX~ in the sorted layout and K4's
    score gradient per sorted row and 128 columns of n ((rows, slots) fp32, which a row's score
    gradient sums), each None unless needed. It reads no weight gradient, so it runs beside K5 / K7
    where _tail_beside_weight_grads, else after them.
    k6_addend(d_score_partial), where given and dX~ is needed: (addend_scale, addend_rows) that K6
    adds to its rows (grouped_gemm_kn), computed between K4 and K6 (the top-K layer's router part).
    activation: the forward's gated activation, which K4 differentiates.
    rev_idx: (T, K) sorted row of each (t, k) where the layout is top-K's (every row one (t, k)),
    else None; dW1's copy of x then scatters (_x_in_sorted_rows).
    Returns (dw1, dw2, what tail returned)."""
    need_x, need_w1, need_w2, need_scores = needs
    d_out = _kernel_rows(grad_out.to(torch.bfloat16))  # a grad may be a view at any offset
    d_h, a_scaled, d_score_partial = down_proj_grad(d_out, w2, h, row_score, offsets, gather_idx,
                                                    partial_rows=partial_rows, activation=activation)
    addend_scale, addend_rows = k6_addend(d_score_partial) if need_x and k6_addend is not None else (None, None)
    dx_rows = grouped_gemm_kn(d_h, w1, offsets, partial_rows=partial_rows, addend_scale=addend_scale,
                              addend_rows=addend_rows) if need_x else None
    d_score_partial = d_score_partial if need_scores else None
    if torch.compiler.is_compiling():
        dw2 = weight_grad(d_out, a_scaled, offsets, gather_idx, True, partial_rows) if need_w2 else None
        dw1 = weight_grad(d_h, x, offsets, gather_idx, False, partial_rows) if need_w1 else None
        return dw1, dw2, tail(dx_rows, d_score_partial)
    # An idle expert's gradient must be exactly zero. On sm90 torch._grouped_mm writes zeros for
    # an empty group (its K loop is empty; pytorch/pytorch#172439 has Blackwell's kernels not
    # doing so), so no pass over the gradients is needed: a torch.where there cost 7 of the
    # backward's 43.6 ms at qwen3-235b. The GPU tests check it on recycled (NaN-poisoned) memory.
    # With no rows at all there is nothing to reduce.
    if gather_idx.shape[0] == 0:
        return (torch.zeros_like(w1) if need_w1 else None), (torch.zeros_like(w2) if need_w2 else None), \
            tail(dx_rows, d_score_partial)

    def weight_grads(sm_margin):
        dw1 = dw2 = None
        if need_w2:
            dw2 = weight_grad(d_out, a_scaled, offsets, gather_idx, True, partial_rows, sm_margin=sm_margin,
                              rows_past_end_zeroed=True)
        if need_w1 and _dw1_on_k7(w2.shape[2], x.device):
            dw1 = weight_grad(d_h, x, offsets, gather_idx, False, partial_rows, sm_margin=sm_margin,
                              rows_past_end_zeroed=True)
        elif need_w1:  # a copy of x in the sorted layout
            dw1 = torch._grouped_mm(d_h.t(), _x_in_sorted_rows(x, gather_idx, rev_idx), offs=offsets[1:])
        return dw1, dw2

    if not ((need_w1 or need_w2) and _tail_beside_weight_grads(x, w2.shape[2], partial_rows)):
        dw1, dw2 = weight_grads(0)
        # dH and A' (and the bf16 copy of dO) are done with: freed before the tail allocates K8's dx
        # and the router's part of dx, two T x d bf16 tensors that otherwise raise the step's peak
        # (deepseek-v3: 451 MiB off the step's peak).
        del d_h, a_scaled, d_out
        return dw1, dw2, tail(dx_rows, d_score_partial)
    main = torch.cuda.current_stream(x.device)
    gemm, side = _side_streams(x.device)
    gemm.wait_stream(main)
    side.wait_stream(main)
    with torch.cuda.stream(gemm):
        dw1, dw2 = weight_grads(_TAIL_SM_MARGIN)
    with torch.cuda.stream(side):
        result = tail(dx_rows, d_score_partial)
    # Joined here and forked from main above, every use is ordered without record_stream: main's
    # later work follows both streams, so main's tensors read there may go back to main's pool when
    # freed; the outputs, from the side streams' pools, are next written there after a fork from
    # main, which follows every use main made of them before they were freed. (record_stream(main)
    # held each block until main's queue at its free had run: with the host a step ahead, that cost
    # new blocks every step; at deepseek-v3's 22 GB of weight gradients, 27% of the backward.)
    main.wait_stream(gemm)
    main.wait_stream(side)
    return dw1, dw2, result


def _routed_forward(x, w1, w2, scores, experts, keep_h, activation):
    """R's metadata, K1 (with the gated activation), K2, K3 for (T, K) routing. Returns the
    output, H (None unless kept) and the metadata (expert_offsets, gather_idx, rev_idx)."""
    E = w2.shape[0]
    # R's layout kernels count experts in shared memory, up to ROUTER_MAX_EXPERTS; past that the
    # same layout by torch ops (no host sync either).
    meta = device_routing_metadata(experts, E) if E <= ROUTER_MAX_EXPERTS else routing_metadata(experts, E)
    h, a = up_proj(x, w1, meta.expert_offsets, meta.gather_idx, keep_h=keep_h, activation=activation)
    y = grouped_gemm(a, w2, meta.expert_offsets)
    return combine(y, scores, meta.rev_idx), (h if keep_h else None), meta


def _routed_backward(needs, grad_out, x, w1, w2, scores, h, offsets, gather_idx, rev_idx, tail, k6_addend=None,
                     activation="swiglu"):
    """_experts_backward over (T, K) routing. needs: (dx, dw1, dw2, dscores). tail(dx_rows,
    d_score_partial): dx_rows is K6's dX~ in the sorted layout (None unless needs[0]), which K8
    (combine_dx) sums per token; d_score_partial K4's score-gradient slots per sorted row (None
    unless needs[3]), which R's backward or _scores_grad sums. k6_addend and activation as in
    _experts_backward. Returns (dw1, dw2, tail's result)."""
    row_score = scores.new_empty(gather_idx.shape[0])
    row_score[rev_idx.reshape(-1).long()] = scores.reshape(-1)
    return _experts_backward(needs, grad_out, x, w1, w2, h, row_score, offsets, gather_idx, False, tail, k6_addend,
                             activation, rev_idx)


def _scores_grad(d_score_partial, rev_idx):
    """d(loss)/d(scores) (T, K) fp32: each (t, k)'s row of K4's score-gradient slots, summed."""
    return d_score_partial.sum(dim=1)[rev_idx.long()]


class _MoEExperts(torch.autograd.Function):
    """Expert MLPs and combine for given routing (T, K).

    Saves x, H, the scores and the int32 routing metadata (the weights are the caller's
    parameters); H only when a graph is built. Backward: _routed_backward."""

    @staticmethod
    def forward(ctx, x, w1, w2, scores, experts, keep_h, activation):
        out, h, meta = _routed_forward(x, w1, w2, scores, experts, keep_h, activation)
        if keep_h:
            ctx.save_for_backward(x, w1, w2, scores, h, *meta)
            ctx.activation = activation
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, w1, w2, scores, h, offsets, gather_idx, rev_idx = ctx.saved_tensors

        def tail(dx_rows, d_score_partial):
            return (combine_dx(dx_rows, rev_idx) if dx_rows is not None else None,
                    _scores_grad(d_score_partial, rev_idx) if d_score_partial is not None else None)

        dw1, dw2, (dx, dscores) = _routed_backward(ctx.needs_input_grad[:4], grad_out, x, w1, w2, scores, h,
                                                   offsets, gather_idx, rev_idx, tail, activation=ctx.activation)
        return dx, dw1, dw2, dscores, None, None, None


# The top-K modes whose d_logits is zero off each token's chosen experts: the router's part of dx,
# d_logits @ router_weight, is then sum_k d_logits[t, e_k] router_weight[e_k], which K6 adds row by
# row (grouped_gemm_kn's addend) in place of the dense GEMM and K8's T x d addend. softmax_topk_norm
# belongs: its softmax over all E cancels in the renormalisation.
_ROUTER_DX_IN_K6_MODES = ("topk_softmax", "softmax_topk_norm")
# Measured on the H200 as the layer's backward both ways: the fold gained 0.2-1.5% at seven of the
# eight anchor configs, deepseek-v3 within its +-2% spread.


def _router_dx_in_k6(routing, grad_logits) -> bool:
    """Whether the top-K layer's backward folds the router's part of dx into K6 (see
    _ROUTER_DX_IN_K6_MODES): not where the logits are returned (autograd then hands their gradient,
    zeros if unused, and a loss on them makes d_logits dense)."""
    return routing in _ROUTER_DX_IN_K6_MODES and grad_logits is None


class _MoELayer(torch.autograd.Function):
    """The top-K layer with R on its kernel: router GEMM, R, the expert MLPs and combine in one
    Function, so that backward adds the router's part of dx, d_logits @ router_weight (cuBLAS),
    inside K8's sum (combine_dx's addend). Apart, autograd sums the two parts of dx in a pass of
    its own over T x d (read twice, written once: 94 µs of olmoe-1b-7b's backward); cuBLAS's addmm
    onto K8's output (beta = 1) read and wrote dx once more (95 µs there). d_logits comes from K4's
    score slots in one kernel (router_backward), where torch's ops took ~14 launches (~60 µs there).

    Saves what the parts did: x, the router and expert weights (the caller's), the scores and
    expert ids, the logits for softmax_topk only, H and the int32 metadata.

    With return_logits the logits are a second output (for an auxiliary router loss); their
    gradient joins R's d_logits before the router's two GEMMs.

    Where d_logits is zero off the chosen experts (_router_dx_in_k6), R's backward runs between K4
    and K6 instead, and K6 adds d_logits[t, e] * router_weight[e] to each of its rows: no dense
    d_logits @ router_weight, and K8 sums without an addend."""

    @staticmethod
    def forward(ctx, x, router_weight, w1, w2, top_k, routing, keep_h, return_logits, activation):
        logits = F.linear(x, router_weight)
        scores, experts = router_topk(logits, top_k, routing)
        out, h, meta = _routed_forward(x, w1, w2, scores, experts, keep_h, activation)
        if keep_h:
            ctx.save_for_backward(x, router_weight, w1, w2, logits if routing == "softmax_topk" else None, scores,
                                  experts, h, *meta)
            ctx.routing, ctx.activation = routing, activation
        return (out, logits) if return_logits else out

    @staticmethod
    def backward(ctx, grad_out, grad_logits=None):
        x, router_weight, w1, w2, logits, scores, experts, h, offsets, gather_idx, rev_idx = ctx.saved_tensors
        need_x, need_router, need_w1, need_w2 = ctx.needs_input_grad[:4]
        need_logits = need_x or need_router
        num_experts = router_weight.shape[0]
        d_logits_before_k6 = []

        def router_dx_in_k6(d_score_partial):
            d_logits, d_logit_rows = router_backward_rows(d_score_partial, rev_idx, scores, experts, num_experts,
                                                          ctx.routing)
            d_logits_before_k6.append(d_logits)
            return d_logit_rows, _kernel_rows(router_weight)

        def tail(dx_rows, d_score_partial):
            if not need_logits:
                return None, None
            if d_logits_before_k6:  # the router's part of dx is in K6's rows
                d_logits, router_dx = d_logits_before_k6[0], None
            else:
                d_logits = router_backward(d_score_partial, rev_idx, scores, experts, logits, num_experts, ctx.routing)
                if grad_logits is not None:  # the caller's loss on the returned logits, summed in fp32
                    d_logits = (d_logits.float() + grad_logits.float()).to(d_logits.dtype)
                router_dx = d_logits @ router_weight if need_x else None
            d_router = d_logits.t() @ x if need_router else None
            dx = combine_dx(dx_rows, rev_idx, router_dx) if need_x else None
            return dx, d_router

        k6_addend = router_dx_in_k6 if _router_dx_in_k6(ctx.routing, grad_logits) else None
        dw1, dw2, (dx, d_router) = _routed_backward((need_x, need_w1, need_w2, need_logits), grad_out, x, w1, w2,
                                                    scores, h, offsets, gather_idx, rev_idx, tail, k6_addend,
                                                    ctx.activation)
        return dx, d_router, dw1, dw2, None, None, None, None, None


class _MoEDenseExperts(torch.autograd.Function):
    """Expert MLPs and combine for a dense (T, E) assignment (token rounding) on the kernels: the
    sorted layout lives in upper-bound buffers (the row count is known only on the device), the
    kernels run with partial_rows, combine walks each token's entries. Saves x, H and the
    metadata; backward: _experts_backward, dX by combine_csr, dscores scattered to (T, E).

    scores (T, E) carry the gradient and are read only at assigned pairs (the router's full
    probabilities serve; their gradient is zero elsewhere). scores_t and assigned_t are the same
    scores and the assignment expert-major (E, T), the layout kernels' input."""

    @staticmethod
    def forward(ctx, x, w1, w2, scores, scores_t, assigned_t, top_k, tile, keep_h, activation):
        E, T = assigned_t.shape
        meta = dense_routing_metadata_expert_major(scores_t, assigned_t, dense_row_bound(T, E, top_k, tile))
        h, a = up_proj(x, w1, meta.expert_offsets, meta.gather_idx, keep_h=keep_h, partial_rows=True,
                       activation=activation)
        y = grouped_gemm(a, w2, meta.expert_offsets, partial_rows=True)
        if keep_h:
            ctx.save_for_backward(x, w1, w2, h, meta.expert_offsets, meta.gather_idx, meta.token_offsets,
                                  meta.rows, meta.sorted_scores)
            ctx.dense_shape, ctx.activation = (T, E), activation
        return combine_csr(y, meta.row_scores, meta.rows, meta.token_offsets)

    @staticmethod
    def backward(ctx, grad_out):
        x, w1, w2, h, offsets, gather_idx, token_offsets, rows, sorted_scores = ctx.saved_tensors
        T, E = ctx.dense_shape

        def tail(dx_rows, d_score_partial):
            dx = dscores = None
            if dx_rows is not None:
                ones = torch.ones(rows.shape, dtype=torch.float32, device=x.device)
                dx = combine_csr(dx_rows, ones, rows, token_offsets).to(x.dtype)
            if d_score_partial is not None:
                # Sorted row r < M holds (gather_idx[r], e) with off[e] <= r < off[e+1]; rows past M
                # go to a spare slot that is dropped (no host sync).
                r = torch.arange(rows.shape[0], dtype=torch.int32, device=x.device)
                # searchsorted over all of offsets, not offsets[1:]: traced, Inductor's Triton code
                # searches a sliced boundary from its buffer's start (pytorch/pytorch#182343), every
                # expert id one too high (seen on the H200, torch 2.11).
                expert = torch.searchsorted(offsets, r, right=True) - 1
                flat = torch.where(r < offsets[-1], gather_idx.long() * E + expert, T * E)
                dscores = torch.zeros(T * E + 1, dtype=torch.float32, device=x.device)
                dscores = dscores.scatter_(0, flat, d_score_partial.sum(dim=1))[: T * E].view(T, E)
            return dx, dscores

        dw1, dw2, (dx, dscores) = _experts_backward(ctx.needs_input_grad[:4], grad_out, x, w1, w2, h, sorted_scores,
                                                    offsets, gather_idx, True, tail, activation=ctx.activation)
        return dx, dw1, dw2, dscores, None, None, None, None, None, None


def moe_routed(x, w1, w2, scores, experts, *, activation="swiglu"):
    """Expert MLPs (gated) for any router's decisions; gradients flow into scores.

    x: (T, d); w1: (E, 2n, d), rows [0, n) gate and [n, 2n) up; w2: (E, d, n);
    scores: (T, K) (fp32 recommended; the kernels combine in fp32); experts: (T, K) integer
    ids in [0, E) (not range-checked on the device: that would sync). activation: the experts'
    A = act(gate) * up, "swiglu" (silu), "geglu" (GELU's tanh form, F.gelu(g,
    approximate="tanh")) or "reglu" (relu). Returns (T, d).
    """
    check_activation(activation)
    x, w1, w2 = _autocast_inputs(x, w1, w2)
    reference.check_routed_args(x, w1, w2, scores, experts)
    _check_one_device("x, w1, w2, scores, experts", x, w1, w2, scores, experts)
    x = _token_rows(x, x.shape[-1])
    if not _kernel_path(x, w1, w2):
        return reference.moe_routed(x, w1, w2, scores.to(x.dtype), experts, activation=activation)
    _check_kernel_top_k("experts.shape[1]", experts.shape[1], x.shape[0])
    # As the ops take them (routing_metadata: int32 / int64 rows; combine: contiguous fp32 scores);
    # a sorted or sliced router's output is often a strided view.
    if experts.dtype not in (torch.int32, torch.int64):
        experts = experts.to(torch.int32)
    return _MoEExperts.apply(x, w1, w2, scores.float().contiguous(), experts.contiguous(),
                             _grad_enabled_for(x, w1, w2, scores), activation)


def moe(x, router_weight, w1, w2, top_k, *, routing="topk_softmax", tile=128, rule="nearest",
        return_router_logits=False, activation="swiglu"):
    """Full MoE layer: router, routing, expert MLPs, combine.

    x: (..., d); router_weight: (E, d) (logits = x @ router_weight.T, then softmax and top-K in
    fp32); routing: "topk_softmax", "softmax_topk", "softmax_topk_norm" or "token_rounding"
    (tile-aware rounding of each expert's token count to a multiple of `tile`, by `rule`
    "nearest", "up" or "down"; docs/design.md §6). Returns x's shape; with return_router_logits, also the
    router's logits (T, E) over the flattened tokens, in x's dtype, for an auxiliary loss
    (load balancing, z-loss) whose gradient reaches x and router_weight. activation: the
    experts' gated activation, as in moe_routed ("swiglu", "geglu" or "reglu").
    """
    reference._check_routing(routing, dense_ok=True)
    check_activation(activation)
    x, router_weight, w1, w2 = _autocast_inputs(x, router_weight, w1, w2)
    d = x.shape[-1]
    if router_weight.dim() != 2 or router_weight.shape[1] != d:
        raise ValueError(f"router_weight: expected shape (E, d) with d = {d}, got {_shape(router_weight)}")
    reference._check_same_dtype("router_weight", router_weight, x)
    E = router_weight.shape[0]
    if w2.dim() != 3 or w2.shape[:2] != (E, d):
        raise ValueError(f"w2: expected shape (E, d, n) with (E, d) = {(E, d)}, got {_shape(w2)}")
    top_k = reference._check_top_k(top_k, E)

    def result(out, logits):
        # (T, d) comes back as the layer's own tensor, not a view of it: FSDP2 warns of (and skips
        # its pre-backward hook under) an in-place op on a module's view output.
        out = out if out.shape == x.shape else out.reshape(x.shape)
        return (out, logits) if return_router_logits else out

    if routing == "token_rounding":
        if not _kernel_path(x.reshape(-1, d), w1, w2):
            out = reference.moe(x, router_weight, w1, w2, top_k, routing, tile=tile, rule=rule, activation=activation)
            return result(out, F.linear(x.reshape(-1, d), router_weight) if return_router_logits else None)
        x2 = _token_rows(x, d)
        logits = F.linear(x2, router_weight)
        probs, probs_t, assigned_t = token_rounding_expert_major(logits, top_k, tile, rule, fp32_probs=True)
        keep_h = _grad_enabled_for(x2, w1, w2, probs)
        return result(_MoEDenseExperts.apply(x2, w1, w2, probs, probs_t, assigned_t, top_k, tile, keep_h, activation),
                      logits)
    x2 = _token_rows(x, d)
    if on_kernels(x2):
        reference._check_expert_weights(x2, w1, w2)
        _check_one_device("x, router_weight, w1, w2", x2, router_weight, w1, w2)
    if _kernel_path(x2, w1, w2):  # its rules and top_k's before the router's GEMM
        _check_kernel_top_k("top_k", top_k, x2.shape[0])
        if E <= ROUTER_MAX_EXPERTS:  # R's kernels; past them the router's top-K in torch, below
            keep_h = _grad_enabled_for(x2, router_weight, w1, w2)
            outs = _MoELayer.apply(x2, router_weight, w1, w2, top_k, routing, keep_h, return_router_logits,
                                   activation)
            return result(*outs) if return_router_logits else result(outs, None)
    logits = F.linear(x2, router_weight)
    scores, experts = scores_from_logits(logits.float(), top_k, routing)
    return result(moe_routed(x2, w1, w2, scores, experts, activation=activation), logits)


def router_scores_backward(logits, scores, experts, grad_scores, routing, num_experts=None):
    """d(loss)/d(logits) (T, E) fp32 from d(loss)/d(scores) (T, K) of a top-K router. logits are
    read only by softmax_topk; the other modes may pass None with num_experts."""
    idx = experts.long()
    num_experts = logits.shape[-1] if num_experts is None else num_experts
    weighted = grad_scores.float() * scores.float()
    if routing == "softmax_topk":
        probs = logits.float().softmax(dim=-1)
        grad = torch.zeros_like(probs).scatter_(1, idx, weighted)
        return grad - probs * weighted.sum(dim=-1, keepdim=True)
    chosen = weighted - scores.float() * weighted.sum(dim=-1, keepdim=True)
    return chosen.new_zeros(chosen.shape[0], num_experts).scatter_(1, idx, chosen)
