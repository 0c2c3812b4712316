"""Distributed SonicMoE: expert parallelism (EP) and FSDP2, on PyTorch's own engine
(torch.distributed, DeviceMesh, fully_shard; NCCL on GPUs, gloo on CPUs). docs/design.md §10.

Expert parallelism splits the E experts over an EP process group (one DeviceMesh dimension):
rank r of ep_size owns experts [r·E/ep, (r+1)·E/ep) in the public layout, w1 (E_local, 2n, d)
and w2 (E_local, d, n); the router (E, d) is replicated. A forward:

1. routes the rank's own tokens with the full router (any per-token mode: topk_softmax,
   softmax_topk, softmax_topk_norm; token_rounding is refused, it needs every rank's
   per-expert counts before any token is assigned);
2. sorts its T·K (token, k) rows by expert, which groups them by owner rank;
3. exchanges the per-expert row counts (one all_to_all_single of a small int64 tensor, which
   also carries every rank's layer config and an error flag) and reads them on the host: the
   one host sync, needed to size the receive buffers;
4. sends each row of x and its fp32 score to the expert's owner (all_to_all_single); x's rows are
   gathered by _GatherRows, whose backward sums each token's K gradient rows in fp32 with one
   rounding, deterministically (autograd's index_select backward, index_add_, rounds after every
   add in bf16 and runs on atomics);
5. the owner runs its local experts on the kernels through sonicmoe.moe_routed, every received
   row a token with top_k = 1, the score applied there (its gradient flows back to the sender);
6. returns the weighted rows with the reverse all_to_all_single and sums each token's K rows
   (_SumRows: fp32, one rounding, deterministic; on the kernels K8, combine_dx).

With one EP rank (ep_size 1) there is nothing to exchange: the layer runs the single-GPU layer
(sonicmoe.moe, through its experts module so that FSDP2 gathers them) and moe_routed_expert_parallel
runs sonicmoe.moe_routed, with no collective, no host sync and no copy of the rows.

Autograd runs through both exchanges (their backward is the reverse exchange), into x, the
router and the local experts' weights. Each rank must run backward through every EP layer it ran
forward through (collectives pair up across ranks); a rank with no tokens (T = 0) still joins.

Kept for backward per layer: what the single-GPU plan keeps (x, the router's logits/scores, and
moe_routed's H, scores and int32 metadata, docs/design.md §3), where moe_routed's "x" is the received rows
(R × d, R = rows this rank's experts got), plus the send order and each send row's token (int64),
each (token, k)'s send row (int32), and the split sizes. The gathered send rows, the returned rows
and the per-row outputs are transient.

Gradient scale: an expert's gradient on its owner sums every EP rank's tokens (the exchange's
backward brings them home); the router's gradient holds the rank's own tokens only, like any
replicated parameter, and must be reduced over the data-parallel ranks (fully_shard_moe does,
as does DDP). fully_shard_moe averages both kinds over all data-parallel ranks (see there).

FSDP2: sonicmoe.MoE needs nothing special. In forward FSDP2 hands the layer unsharded parameters
that are fresh contiguous tensors (its own all-gather output per parameter), so w1 / w2 meet the
kernels' rule (contiguous, 16-byte aligned); where something else hands a view into a flat buffer,
the kernel path refuses with an error naming w1 / w2 and the fix. Activation checkpointing and
torch.compile compose with both (the host read of the counts breaks a compiled graph once per EP
layer).

Bad input never hangs: configuration errors that every rank sees alike (E not divisible by the
EP size, token_rounding, a mesh of the wrong device or shape) raise before any communication;
an error in one rank's input (its x) rides in the count exchange, which every rank always
sends, and then every rank raises.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from . import reference
from ._ops import (GLU_ACTIVATIONS, ROUTER_MAX_EXPERTS, ROUTER_MAX_TOP_K, check_activation, combine_dx, on_kernels,
                   router_topk)
from .functional import _kernel_rows, moe, moe_routed
from .layer import MoE
from .routing import _INT32_MAX, scores_from_logits

__all__ = [
    "ExpertParallelMoE",
    "LocalExperts",
    "all_to_all_rows",
    "fully_shard_moe",
    "moe_routed_expert_parallel",
    "parallelize_moe",
]

# Header each rank sends to every rank in the count exchange: error flag, then the config that
# must agree across the EP group (a mismatch would misread rows or hang in the row exchange).
_HEADER = ("error", "d", "E", "n", "top_k", "routing", "dtype", "activation")
_ROUTING_CODES = {None: 0, "topk_softmax": 1, "softmax_topk": 2, "softmax_topk_norm": 3}
_DTYPE_CODES = {torch.float32: 1, torch.bfloat16: 2, torch.float16: 3, torch.float64: 4}


def _group_of(ep_mesh):
    """(process group, size, rank) of a 1-D DeviceMesh or a ProcessGroup."""
    if isinstance(ep_mesh, dist.ProcessGroup):
        return ep_mesh, dist.get_world_size(ep_mesh), dist.get_rank(ep_mesh)
    from torch.distributed.device_mesh import DeviceMesh
    if not isinstance(ep_mesh, DeviceMesh):
        raise TypeError(f"ep_mesh = {ep_mesh!r} breaks the rule: must be a 1-D DeviceMesh or a ProcessGroup")
    if ep_mesh.ndim != 1:
        raise ValueError(f"ep_mesh.ndim = {ep_mesh.ndim} breaks the rule: must be 1 (pass mesh['ep'] of a 2-D "
                         "mesh)")
    group = ep_mesh.get_group()
    return group, ep_mesh.size(), ep_mesh.get_local_rank()


def _check_group_device(group, device, what):
    """gloo moves CPU tensors, NCCL CUDA ones: a mismatch fails or stalls inside the collective."""
    backend = str(dist.get_backend(group)).lower()
    want = {"gloo": "cpu", "nccl": "cuda"}.get(backend)
    if want is not None and device.type != want:
        raise ValueError(f"{what}.device = {device} breaks the rule: the EP group's backend is {backend}, "
                         f"which needs {want} tensors (build the mesh on the layer's device type)")


def _check_ep_split(num_experts, ep_size, local_experts=None):
    if num_experts % ep_size:
        raise ValueError(f"num_experts = {num_experts} breaks the rule: must be divisible by the EP size "
                         f"{ep_size} (each rank owns E / ep_size experts)")
    if local_experts is not None and local_experts * ep_size != num_experts:
        raise ValueError(f"w1.shape[0] = {local_experts} breaks the rule: must be E / ep_size = "
                         f"{num_experts} / {ep_size} = {num_experts // ep_size} (the rank's share)")


def _all_to_all(inp, out_splits, in_splits, group):
    inp = inp.contiguous()
    out = inp.new_empty((sum(out_splits),) + tuple(inp.shape[1:]))
    dist.all_to_all_single(out, inp, out_splits, in_splits, group=group)
    return out


class _AllToAllRows(torch.autograd.Function):
    """all_to_all_single over dim 0; backward is the reverse exchange of the gradient."""

    @staticmethod
    def forward(ctx, inp, out_splits, in_splits, group):
        ctx.splits, ctx.group = (out_splits, in_splits), group
        return _all_to_all(inp, out_splits, in_splits, group)

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        return _all_to_all(grad, in_splits, out_splits, ctx.group), None, None, None


def all_to_all_rows(inp, out_splits, in_splits, group):
    """Differentiable all_to_all_single of inp's rows: in_splits[j] rows go to rank j,
    out_splits[j] come from it (host lists of ints)."""
    return _AllToAllRows.apply(inp, list(out_splits), list(in_splits), group)


def _sum_rows(rows, pos):
    """out[t] = sum over k of rows[pos[t, k]], pos (T, K): accumulated in fp32 (fp64 rows in fp64),
    rounded once to rows' dtype, in a fixed order (no atomics). Returns (T, d)."""
    T, K = pos.shape
    d = rows.shape[1]
    # K8 (combine_dx) holds a token's K row indices in one warp's lanes and reads 16-byte vectors.
    if (on_kernels(rows) and rows.dtype == torch.bfloat16 and 1 <= K <= ROUTER_MAX_TOP_K and d % 8 == 0
            and rows.shape[0] <= _INT32_MAX):
        return combine_dx(_kernel_rows(rows), pos.to(torch.int32).contiguous())
    acc = torch.promote_types(rows.dtype, torch.float32)
    return rows.index_select(0, pos.reshape(-1)).view(T, K, d).sum(1, dtype=acc).to(rows.dtype)


class _GatherRows(torch.autograd.Function):
    """rows = src.index_select(0, idx), where every src row t is taken K times: idx (T·K,) int64
    names each row's source, pos (T, K) each source's K rows (rows[pos[t, k]] = src[t]).
    Backward is _SumRows (each source's K gradient rows summed in fp32, rounded once,
    deterministic); each Function is the other's transpose, so double backward works too."""

    @staticmethod
    def forward(ctx, src, idx, pos):
        ctx.save_for_backward(idx, pos)
        ctx.src_shape = tuple(src.shape)
        return src.index_select(0, idx)

    @staticmethod
    def backward(ctx, grad_rows):
        idx, pos = ctx.saved_tensors
        grad = _SumRows.apply(grad_rows, pos, idx, ctx.src_shape) if ctx.needs_input_grad[0] else None
        return grad, None, None


class _SumRows(torch.autograd.Function):
    """out[t] = sum over k of rows[pos[t, k]] (_sum_rows), shaped out_shape (T rows of d, any
    leading dims); idx (T·K,) is pos's transpose (the token of each row), for the backward, a
    gather of the output gradient (_GatherRows)."""

    @staticmethod
    def forward(ctx, rows, pos, idx, out_shape):
        ctx.save_for_backward(idx, pos)
        out = _sum_rows(rows, pos)
        # detach: a view made inside a Function would refuse in-place ops on the output (FSDP2
        # warns of those on a module's view output); this one shares only memory.
        return out if out.shape == tuple(out_shape) else out.view(out_shape).detach()

    @staticmethod
    def backward(ctx, grad_out):
        idx, pos = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        grad = _GatherRows.apply(grad_out.reshape(-1, grad_out.shape[-1]), idx, pos)
        return grad, None, None, None


def _exchange_counts(counts, header, group, ep_size):
    """All-to-all of [header, counts of rank j's experts] to every rank j; returns the host lists
    (headers from each rank, rows this rank sends to each rank, rows it receives from each rank,
    received per-(source, local expert) counts) and the latter on the device."""
    local = counts.shape[0] // ep_size
    head = torch.tensor(header, dtype=torch.int64).to(counts.device).expand(ep_size, len(header))
    send = torch.cat([head, counts.view(ep_size, local)], dim=1)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    recv_counts = recv[:, len(header):]
    # The one host sync of the layer: buffer sizes of the row exchange (and the headers).
    host = torch.cat([recv.reshape(-1), counts.view(ep_size, local).sum(1)]).tolist()  # ok-host
    width = len(header) + local
    headers = [host[j * width: j * width + len(header)] for j in range(ep_size)]
    recv_rows = [sum(host[j * width + len(header): (j + 1) * width]) for j in range(ep_size)]
    send_rows = host[ep_size * width:]
    return headers, send_rows, recv_rows, recv_counts


def _raise_together(headers, my_rank, my_error):
    """Every rank reads every header; all raise on an error flag or a config mismatch."""
    if my_error is not None:
        raise ValueError(my_error)
    bad = [j for j, h in enumerate(headers) if h[0]]
    if bad:
        raise ValueError(f"EP ranks {bad} refused their input (see their error); this rank stops with them")
    mine = headers[my_rank]
    for j, h in enumerate(headers):
        diff = [f"{name} {a} here, {b} on EP rank {j}" for name, a, b in zip(_HEADER, mine, h) if a != b]
        if diff:
            raise ValueError("the EP group's layers disagree: " + "; ".join(diff) + " (every rank must run the "
                             "same layer config and x.shape[-1])")


def _dispatch_combine(x2, scores, experts, num_experts, group, ep_size, ep_rank, header, error, run_local,
                      device, out_shape=None):
    """Steps 2-6 of the module docstring for routed rows: x2 (T, d), scores (T, K) float,
    experts (T, K) global ids. run_local(rows, row_scores (R, 1), local_ids (R, 1)) -> (R, d).
    Returns out_shape (default (T, d))."""
    local = num_experts // ep_size
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
    if error is None:  # else the header's flag tells every rank; nothing of x is read
        T, K = experts.shape
        flat = experts.reshape(-1).long()
        counts.scatter_add_(0, flat, torch.ones_like(flat))
    headers, send_rows, recv_rows, recv_counts = _exchange_counts(counts, header, group, ep_size)
    _raise_together(headers, ep_rank, error)

    # Rows grouped by expert, hence by owner rank; stable keeps (token, k) order within one.
    order = torch.sort(flat, stable=True).indices
    token_of_row = torch.div(order, K, rounding_mode="floor")
    # pos[t, k]: the send row of (t, k), order's inverse permutation (int32 where it fits, as K8 reads it).
    index_dtype = torch.int32 if T * K <= _INT32_MAX else torch.int64
    pos = torch.empty(T * K, dtype=index_dtype, device=device)
    pos[order] = torch.arange(T * K, dtype=index_dtype, device=device)
    pos = pos.view(T, K)
    send_x = _GatherRows.apply(x2, token_of_row, pos)
    # fp32 scores: the kernels apply them in fp32; a permutation, so its backward adds nothing up.
    send_s = scores.float().reshape(-1).index_select(0, order)
    recv_x = all_to_all_rows(send_x, recv_rows, send_rows, group)
    recv_s = all_to_all_rows(send_s, recv_rows, send_rows, group)
    # Received rows come by source rank, each source's by local expert.
    ids = torch.arange(local, device=device).repeat(ep_size)
    local_ids = ids.repeat_interleave(recv_counts.reshape(-1), output_size=sum(recv_rows))
    y = run_local(recv_x, recv_s.unsqueeze(1), local_ids.unsqueeze(1))
    back = all_to_all_rows(y, send_rows, recv_rows, group)
    out_shape = tuple(out_shape) if out_shape is not None else tuple(x2.shape)
    # fp32 accumulation over K, as the single-GPU combine (K3).
    return _SumRows.apply(back, pos, token_of_row, out_shape)


def _route(logits, top_k, routing):
    """Differentiable fp32 scores (T, K) and expert ids, with the single-GPU layer's decisions: on
    the kernels R picks the experts (its tie rule: lower id first), torch recomputes the scores at
    them so their gradient reaches the router; elsewhere scores_from_logits, as sonicmoe.moe."""
    E = logits.shape[1]
    if not (on_kernels(logits) and E <= ROUTER_MAX_EXPERTS and top_k <= ROUTER_MAX_TOP_K):
        return scores_from_logits(logits.float(), top_k, routing)
    experts = router_topk(logits.detach(), top_k, routing)[1].long()
    logits = logits.float()
    if routing == "topk_softmax":
        return logits.gather(1, experts).softmax(dim=-1), experts
    scores = logits.softmax(dim=-1).gather(1, experts)
    if routing == "softmax_topk_norm":
        scores = scores / scores.sum(dim=-1, keepdim=True)
    return scores, experts


def _input_error(x, router_weight, w1, w2, scores=None, experts=None):
    """The local input rules, as a message (None where they hold); no communication."""
    try:
        if not isinstance(x, torch.Tensor) or x.dim() < 1:
            raise ValueError(f"x: expected a tensor of shape (..., d), got {getattr(x, 'shape', x)!r}")
        x2 = x.reshape(-1, x.shape[-1])
        if router_weight is not None:
            if x2.shape[1] != router_weight.shape[1]:
                raise ValueError(f"x.shape[-1] = {x2.shape[1]} breaks the rule: must be d = "
                                 f"{router_weight.shape[1]} (router_weight's)")
            reference._check_same_dtype("router_weight", router_weight, x2)
        reference._check_expert_weights(x2, w1, w2)
        if scores is not None or experts is not None:
            if not isinstance(scores, torch.Tensor) or not isinstance(experts, torch.Tensor):
                raise ValueError(f"scores, experts: expected tensors (T, K), got {type(scores).__name__}, "
                                 f"{type(experts).__name__}")
            reference.check_routed_args(x2, w1, w2, scores, experts)
        devices = {t.device for t in (x2, w1, w2, router_weight, scores, experts) if t is not None}
        if len(devices) != 1:
            raise ValueError(f"x, router_weight, w1, w2: expected one device, got {sorted(map(str, devices))}")
    except ValueError as exc:
        return str(exc)
    return None


def moe_routed_expert_parallel(x, w1, w2, scores, experts, num_experts, group, *, activation="swiglu"):
    """sonicmoe.moe_routed across an EP group, for any router's decisions.

    x: (T, d) this rank's tokens; w1 (E_local, 2n, d), w2 (E_local, d, n): this rank's experts,
    global ids [rank·E_local, (rank+1)·E_local); scores (T, K) and experts (T, K) global ids in
    [0, num_experts) (not range-checked: that would read them on the host). group: a ProcessGroup
    or 1-D DeviceMesh. activation: the experts' gated activation, as in sonicmoe.moe_routed (the
    same on every rank). Gradients flow into x, w1, w2 and scores. Returns (T, d)."""
    check_activation(activation)
    group, ep_size, ep_rank = _group_of(group)
    _check_ep_split(num_experts, ep_size, w1.shape[0] if w1.dim() == 3 else None)
    _check_group_device(group, w1.device, "w1")
    error = _input_error(x, None, w1, w2, scores, experts)
    if ep_size == 1:  # nothing to exchange: the single-GPU call, global ids are local ids
        if error is not None:
            raise ValueError(error)
        return moe_routed(x.reshape(-1, x.shape[-1]), w1, w2, scores, experts, activation=activation)
    header = [int(error is not None), x.shape[-1] if error is None else -1, num_experts, w2.shape[-1],
              experts.shape[-1] if error is None else -1, 0, _DTYPE_CODES.get(getattr(x, "dtype", None), 0),
              GLU_ACTIVATIONS[activation]]

    def run_local(rows, row_scores, ids):
        return moe_routed(rows, w1, w2, row_scores, ids, activation=activation)

    x2 = x.reshape(-1, x.shape[-1]) if error is None else None
    return _dispatch_combine(x2, scores, experts, num_experts, group, ep_size, ep_rank, header, error, run_local,
                             w1.device)


class LocalExperts(nn.Module):
    """A rank's share of the experts, w1 (E_local, 2n, d) and w2 (E_local, d, n). Its own module so
    that FSDP2 can shard it over another mesh than the router (fully_shard_moe); forward runs
    moe_routed on received rows, or, given router_weight (an EP group of one rank, where it holds
    every expert), the whole single-GPU layer sonicmoe.moe on the rank's tokens. Either way
    through forward, where FSDP2 gathers the weights in its pre-forward hook. activation: the
    experts' gated activation (sonicmoe.MoE's)."""

    def __init__(self, local_experts, hidden_size, intermediate_size, device=None, dtype=None, activation="swiglu"):
        super().__init__()
        self.activation = check_activation(activation)
        factory = {"device": device, "dtype": dtype}
        self.w1 = nn.Parameter(torch.empty(local_experts, 2 * intermediate_size, hidden_size, **factory))
        self.w2 = nn.Parameter(torch.empty(local_experts, hidden_size, intermediate_size, **factory))

    def forward(self, rows, scores=None, local_ids=None, *, router_weight=None, top_k=None, routing=None,
                return_router_logits=False):
        if router_weight is not None:
            return moe(rows, router_weight, self.w1, self.w2, top_k, routing=routing,
                       return_router_logits=return_router_logits, activation=self.activation)
        return moe_routed(rows, self.w1, self.w2, scores, local_ids, activation=self.activation)

    def extra_repr(self):
        E, d, n = self.w2.shape
        return f"local_experts={E}, hidden_size={d}, intermediate_size={n}, activation={self.activation!r}"


class ExpertParallelMoE(nn.Module):
    """sonicmoe.MoE with its experts split over an EP group (see the module docstring).

    Parameters: router_weight (E, d), replicated; experts.w1 (E_local, 2n, d) and experts.w2
    (E_local, d, n), this rank's experts [ep_rank·E_local, (ep_rank+1)·E_local). Build one from
    a full MoE with from_moe / parallelize_moe (every rank slices its share of the same weights),
    or directly (then initialise the router identically on every rank).

    routing: topk_softmax, softmax_topk or softmax_topk_norm; token_rounding is refused (it needs
    the global per-expert counts). return_router_logits and activation as in MoE (the rank's
    tokens' logits; the experts' gated activation, held by experts).
    """

    def __init__(self, hidden_size, intermediate_size, num_experts, top_k, ep_mesh, routing="topk_softmax",
                 device=None, dtype=None, return_router_logits=False, activation="swiglu"):
        super().__init__()
        if routing == "token_rounding":
            raise ValueError("routing = 'token_rounding' breaks the rule: not supported under expert parallelism "
                             "(rounding each expert's count to a tile needs the global per-expert counts before "
                             "any token is assigned); use topk_softmax, softmax_topk or softmax_topk_norm")
        reference._check_routing(routing)
        check_activation(activation)
        self.top_k = reference._check_top_k(top_k, num_experts)
        group, ep_size, ep_rank = _group_of(ep_mesh)
        _check_ep_split(num_experts, ep_size)
        self.ep_mesh, self.ep_group, self.ep_size, self.ep_rank = ep_mesh, group, ep_size, ep_rank
        self.num_experts, self.routing, self.return_router_logits = num_experts, routing, return_router_logits
        self.router_weight = nn.Parameter(torch.empty(num_experts, hidden_size, device=device, dtype=dtype))
        self.experts = LocalExperts(num_experts // ep_size, hidden_size, intermediate_size, device, dtype,
                                    activation=activation)
        self.reset_parameters()

    @property
    def activation(self):
        return self.experts.activation

    def reset_parameters(self):
        # MoE's init (nn.Linear's default); from_moe copies a full layer's slice instead.
        d, n = self.router_weight.shape[1], self.experts.w2.shape[2]
        for weight, fan_in in ((self.router_weight, d), (self.experts.w1, d), (self.experts.w2, n)):
            bound = 1.0 / math.sqrt(fan_in)
            nn.init.uniform_(weight, -bound, bound)

    @property
    def local_expert_range(self):
        local = self.num_experts // self.ep_size
        return range(self.ep_rank * local, (self.ep_rank + 1) * local)

    @classmethod
    def from_moe(cls, moe: MoE, ep_mesh):
        """An EP layer holding moe's router and this rank's slice of its experts (copies)."""
        if not isinstance(moe, MoE):
            raise TypeError(f"moe = {type(moe).__name__} breaks the rule: must be a sonicmoe.MoE")
        E, d, n = moe.w2.shape
        layer = cls(d, n, E, moe.top_k, ep_mesh, routing=moe.routing, device="meta", dtype=moe.w2.dtype,
                    return_router_logits=moe.return_router_logits, activation=moe.activation)
        rows = layer.local_expert_range
        with torch.no_grad():
            layer.router_weight = nn.Parameter(moe.router_weight.detach().clone(),
                                               requires_grad=moe.router_weight.requires_grad)
            layer.experts.w1 = nn.Parameter(moe.w1.detach()[rows.start:rows.stop].clone(),
                                            requires_grad=moe.w1.requires_grad)
            layer.experts.w2 = nn.Parameter(moe.w2.detach()[rows.start:rows.stop].clone(),
                                            requires_grad=moe.w2.requires_grad)
        layer.train(moe.training)
        return layer

    def forward(self, x):
        _check_group_device(self.ep_group, self.router_weight.device, "router_weight")
        router_weight, w1, w2 = self.router_weight, self.experts.w1, self.experts.w2
        error = _input_error(x, router_weight, w1, w2)
        if self.ep_size == 1:  # nothing to exchange: the single-GPU layer on the rank's tokens
            if error is not None:
                raise ValueError(error)
            return self.experts(x, router_weight=router_weight, top_k=self.top_k, routing=self.routing,
                                return_router_logits=self.return_router_logits)
        d = x.shape[-1] if error is None else -1
        header = [int(error is not None), d, self.num_experts, w2.shape[-1], self.top_k,
                  _ROUTING_CODES[self.routing], _DTYPE_CODES.get(getattr(x, "dtype", None), 0),
                  GLU_ACTIVATIONS[self.activation]]
        scores = experts = logits = x2 = None
        if error is None:
            x2 = x.reshape(-1, d)
            logits = F.linear(x2, router_weight)
            scores, experts = _route(logits, self.top_k, self.routing)
        out = _dispatch_combine(x2, scores, experts, self.num_experts, self.ep_group, self.ep_size, self.ep_rank,
                                header, error, self.experts, router_weight.device, None if error else x.shape)
        return (out, logits) if self.return_router_logits else out

    def extra_repr(self):
        return (f"num_experts={self.num_experts}, top_k={self.top_k}, routing={self.routing!r}, "
                f"activation={self.activation!r}, ep_size={self.ep_size}, ep_rank={self.ep_rank}")


def parallelize_moe(model: nn.Module, ep_mesh) -> nn.Module:
    """Replace every sonicmoe.MoE in model (model itself included) by an ExpertParallelMoE holding
    this rank's experts of it; returns the model (or the new layer where model is a MoE). Every
    rank must call it on the same weights (e.g. the same seed), as a collective."""
    if isinstance(model, MoE):
        return ExpertParallelMoE.from_moe(model, ep_mesh)
    for name, child in list(model.named_children()):
        setattr(model, name, parallelize_moe(child, ep_mesh))
    return model


def fully_shard_moe(model: nn.Module, mesh, *, mp_policy=None, reshard_after_forward=True, dense_mesh=None):
    """FSDP2 over a model holding sonicmoe layers, as torchtitan composes it.

    mesh 1-D (data parallel): fully_shard each sonicmoe.MoE, then the model.
    mesh 2-D with dims ("dp", "ep") (data-parallel ranks = dp · ep): each ExpertParallelMoE's
    experts are split by EP over mesh["ep"] (parallelize_moe with that mesh) and FSDP-sharded over
    mesh["dp"]; everything else is sharded over all dp · ep ranks (dense_mesh, by default the
    flattened mesh). Gradients are averaged over all dp · ep ranks for every parameter: the
    experts' reduction divides by dp · ep, since their gradient already sums the EP ranks' tokens.
    The experts keep their fp32 scores (no input cast on their module).
    Returns the model (fully_shard changes it in place)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = mp_policy or MixedPrecisionPolicy()
    kw = {"mp_policy": policy, "reshard_after_forward": reshard_after_forward}
    layers_ep = [m for m in model.modules() if isinstance(m, ExpertParallelMoE)]
    layers = [m for m in model.modules() if isinstance(m, MoE)]
    if mesh.ndim == 1:
        if layers_ep:
            raise ValueError("mesh.ndim = 1 breaks the rule: a model with ExpertParallelMoE layers needs a 2-D mesh "
                             "with dims ('dp', 'ep')")
        for layer in layers:
            if layer is not model:
                fully_shard(layer, mesh=mesh, **kw)
        return fully_shard(model, mesh=mesh, **kw)
    if mesh.ndim != 2 or tuple(mesh.mesh_dim_names or ()) != ("dp", "ep"):
        raise ValueError(f"mesh (ndim {mesh.ndim}, dims {mesh.mesh_dim_names}) breaks the rule: must be 1-D, or "
                         "2-D with mesh_dim_names ('dp', 'ep')")
    ep_ranks = sorted(dist.get_process_group_ranks(mesh["ep"].get_group()))
    for layer in layers_ep:
        mine = sorted(dist.get_process_group_ranks(layer.ep_group))
        if mine != ep_ranks:
            raise ValueError(f"ExpertParallelMoE's EP ranks {mine} break the rule: must be mesh['ep']'s ranks "
                             f"{ep_ranks} (parallelize_moe with mesh['ep'])")
    if layers:
        raise ValueError("a sonicmoe.MoE under a 2-D mesh breaks the rule: call parallelize_moe(model, mesh['ep']) "
                         "first")
    dense = dense_mesh if dense_mesh is not None else mesh._flatten("dp_ep")  # as torchtitan does
    expert_kw = dict(kw, mp_policy=MixedPrecisionPolicy(param_dtype=policy.param_dtype,
                                                        reduce_dtype=policy.reduce_dtype,
                                                        output_dtype=policy.output_dtype,
                                                        cast_forward_inputs=False))
    for layer in layers_ep:
        fully_shard(layer.experts, mesh=mesh["dp"], **expert_kw)
        layer.experts.set_gradient_divide_factor(float(mesh.size()))
        # gloo has no PREMUL_SUM: sum, then divide. Not on one rank, where FSDP2 (torch 2.14) divides
        # by the factor once in its copy and again after it when forced.
        if mesh["dp"].size() > 1 and str(dist.get_backend(mesh["dp"].get_group())).lower() == "gloo":
            layer.experts.set_force_sum_reduction_for_comms(True)
        fully_shard(layer, mesh=dense, **kw)
    return fully_shard(model, mesh=dense, **kw)
