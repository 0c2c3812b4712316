"""Routing metadata for the sorted (grouped-by-expert) layout of docs/design.md §4.

Everything here stays on the tensors' device with no host sync: output sizes depend
only on shapes, never on data, so the helpers are CUDA-graph capturable and trace
under torch.compile.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ._ops import (ROUTER_MAX_EXPERTS, ROUTER_MAX_TOP_K, dense_layout, on_kernels, rounding_probs, router_topk,
                   token_rounding_assign)

__all__ = [
    "DenseRoutingMetadata",
    "RoutingMetadata",
    "dense_routing_metadata",
    "dense_routing_metadata_by_torch",
    "dense_routing_metadata_expert_major",
    "dense_row_bound",
    "TOKEN_ROUNDING_RULES",
    "routing_metadata",
    "scores_from_logits",
    "token_rounding",
    "token_rounding_expert_major",
]


class RoutingMetadata(NamedTuple):
    """Index vectors of the sorted layout; T*K rows grouped by expert.

    expert_offsets: (E+1,) int32; expert e owns rows [off[e], off[e+1]),
        off[0] = 0 and off[E] = T*K.
    gather_idx: (T*K,) int32; sorted row -> token index.
    rev_idx: (T, K) int32; (token, k) -> sorted row.

    Within an expert, rows are ordered by (token, k) ascending.
    """

    expert_offsets: torch.Tensor
    gather_idx: torch.Tensor
    rev_idx: torch.Tensor


def routing_metadata(experts: torch.Tensor, num_experts: int) -> RoutingMetadata:
    """Build the sorted-layout metadata from (T, K) expert ids.

    Ids must lie in [0, num_experts); that is not checked, since checking would sync.
    """
    if num_experts < 1:
        raise ValueError(f"num_experts: expected num_experts >= 1, got {num_experts}")
    if experts.dim() != 2:
        raise ValueError(
            f"experts: expected a 2-D tensor (T, K), got shape {tuple(experts.shape)}"
        )
    if experts.is_floating_point() or experts.is_complex() or experts.dtype == torch.bool:
        raise ValueError(f"experts: expected an integer dtype, got {experts.dtype}")

    T, K = experts.shape
    device = experts.device
    flat = experts.reshape(-1).long()

    # Integer atomics are exact, so the counts are deterministic; bincount would sync.
    counts = torch.zeros(num_experts, dtype=torch.int32, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    expert_offsets = torch.zeros(num_experts + 1, dtype=torch.int32, device=device)
    expert_offsets[1:] = counts.cumsum(0)

    # Stable sort of the (token, k)-major flat ids keeps (token, k) order within an expert.
    order = torch.sort(flat, stable=True).indices
    gather_idx = torch.div(order, max(K, 1), rounding_mode="floor").to(torch.int32)
    rev_idx = torch.empty(T * K, dtype=torch.int32, device=device)
    rev_idx.scatter_(0, order, torch.arange(T * K, dtype=torch.int32, device=device))

    return RoutingMetadata(expert_offsets, gather_idx, rev_idx.view(T, K))


def scores_from_logits(
    logits: torch.Tensor, top_k: int, routing: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-K token choice from router logits (T, E), in the dtype of the logits.

    "topk_softmax": softmax over the K largest logits (Mixtral); "softmax_topk": softmax over
    all E, keep the K largest, no renormalisation (OLMoE); "softmax_topk_norm": the same,
    renormalised over the K (Qwen3). Returns scores (T, K) and experts (T, K) int64, ordered
    by decreasing score. Callers validate routing and top_k.
    """
    if routing == "topk_softmax":
        top_logits, experts = logits.topk(top_k, dim=-1)
        return top_logits.softmax(dim=-1), experts
    scores, experts = logits.softmax(dim=-1).topk(top_k, dim=-1)
    if routing == "softmax_topk_norm":
        scores = scores / scores.sum(dim=-1, keepdim=True)
    return scores, experts


TOKEN_ROUNDING_RULES = ("nearest", "up", "down")


def token_rounding(
    logits: torch.Tensor, top_k: int, tile: int = 128, rule: str = "nearest"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tile-aware token rounding (docs/design.md §6) from router logits (T, E), with no host sync.

    Start from top-K token choice; per expert round its token count f_e to a multiple of
    `tile`: "nearest" (ties round up), "up" or "down", capped at T. Rounding up adds the
    expert's best-scoring tokens that did not choose it; rounding down drops its
    lowest-scoring chosen tokens; a chosen token always outranks an added one, so each
    expert deviates from top-K by fewer than `tile` tokens.

    Scores are softmax probabilities over all E (an added token carries its probability), in
    the dtype of the logits; gradients flow through them. Returns scores (T, E), zero where
    not assigned, and the assignment mask (T, E) bool. A token may end with more or fewer
    than K experts (or none). Ties are broken by token index, so the result is deterministic.
    Float64 probabilities rank by a sort; 32-bit and narrower ones by a bounded top-k, which
    gives the same result without sorting all T tokens per expert.
    """
    probs, _, assigned_t = token_rounding_expert_major(logits, top_k, tile, rule)
    assigned = assigned_t.t().contiguous()
    return probs * assigned, assigned


def token_rounding_expert_major(
    logits: torch.Tensor, top_k: int, tile: int = 128, rule: str = "nearest", *, fp32_probs: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """token_rounding's assignment in the form the layer's kernels take, without the (T, E)
    transposes and the masking pass that the public form needs (at T 16384, E 512 on the H200
    those were ~200 of a 1.6 ms forward).

    Returns probs (T, E), the softmax over all E (differentiable; scores = probs where assigned),
    probs_t (E, T) fp32 detached, and assigned_t (E, T) bool (either may be a transposed view).
    fp32_probs: the probabilities of bf16 logits in fp32 (the layer's router), not in bf16.
    """
    if rule not in TOKEN_ROUNDING_RULES:
        raise ValueError(f"rule: expected one of {TOKEN_ROUNDING_RULES}, got {rule!r}")
    if isinstance(tile, bool) or not isinstance(tile, int) or tile < 1:
        raise ValueError(f"tile: expected a positive int, got {tile!r}")
    if logits.dim() != 2:
        raise ValueError(f"logits: expected a 2-D tensor (T, E), got shape {tuple(logits.shape)}")
    T, E = logits.shape
    if not 1 <= top_k <= E:
        raise ValueError(f"top_k: expected 1 <= top_k <= E = {E}, got {top_k}")

    rule_index = TOKEN_ROUNDING_RULES.index(rule)
    on_kernels = _on_routing_kernels(logits, E, top_k) and tile <= _INT32_MAX  # the kernels' int tile
    if on_kernels and (logits.dtype == torch.float32 or fp32_probs):
        # One kernel for the softmax, R's top-K and the expert-major copies (rounding_probs),
        # then one block per expert flips what rounding changes (token_rounding.cu).
        if torch.is_grad_enabled() and logits.requires_grad:
            probs, probs_t, chosen_t = _RoundingProbs.apply(logits.contiguous(), top_k)
        else:
            _, probs_t, chosen_t = rounding_probs(logits.contiguous(), top_k, False)
            probs = probs_t.t()
        assigned_t, _ = token_rounding_assign(probs_t, chosen_t, tile, rule_index)
        return probs, probs_t, assigned_t
    if fp32_probs:
        logits = logits.float()
    probs = logits.softmax(dim=-1)
    if on_kernels:
        # bf16 probabilities of bf16 logits: R's top-K, then token_rounding_assign.
        top = router_topk(logits.detach().contiguous(), top_k, "topk_softmax")[1].long()
        chosen_t = torch.zeros(E, T, dtype=torch.bool, device=logits.device).scatter_(0, top.t(), True)
        probs_t = probs.detach().float().t().contiguous()
        assigned_t, _ = token_rounding_assign(probs_t, chosen_t, tile, rule_index)
        return probs, probs_t, assigned_t
    chosen = torch.zeros(T, E, dtype=torch.bool, device=logits.device)
    chosen.scatter_(1, logits.topk(top_k, dim=-1).indices, True)
    counts = chosen.sum(dim=0)
    target = _rounded_counts(counts, T, tile, rule)
    if probs.element_size() <= 4:
        assigned_t = _assign_by_bounded_topk(probs.detach(), chosen, counts, target, tile)
    else:
        assigned_t = _assign_by_sort(probs.detach(), chosen, target).t()
    return probs, probs.detach().float().t(), assigned_t


class _RoundingProbs(torch.autograd.Function):
    """rounding_probs with its softmax's backward: probs (T, E) fp32 carries the gradient;
    probs_t and chosen_t are the expert-major copies (not differentiable)."""

    @staticmethod
    def forward(ctx, logits, top_k):
        probs, probs_t, chosen_t = rounding_probs(logits, top_k, True)
        ctx.save_for_backward(probs)
        ctx.logits_dtype = logits.dtype
        ctx.mark_non_differentiable(probs_t, chosen_t)
        return probs, probs_t, chosen_t

    @staticmethod
    def backward(ctx, grad_probs, _grad_probs_t, _grad_chosen_t):
        (probs,) = ctx.saved_tensors
        grad = torch._softmax_backward_data(grad_probs.float().contiguous(), probs, -1, torch.float32)
        return grad.to(ctx.logits_dtype), None


_INT32_MAX = 2**31 - 1


def _fits_routing_kernels(num_tokens, num_experts) -> bool:
    """R's and token rounding's kernels: E <= ROUTER_MAX_EXPERTS, and (T, E) indexed in int32."""
    return num_experts <= ROUTER_MAX_EXPERTS and num_tokens * num_experts <= _INT32_MAX


def _on_routing_kernels(logits, num_experts, top_k) -> bool:
    """CUDA logits that R's kernels take (router_topk, token_rounding_assign, dense_layout)."""
    return (on_kernels(logits) and logits.dtype in (torch.float32, torch.bfloat16)
            and _fits_routing_kernels(logits.shape[0], num_experts) and top_k <= ROUTER_MAX_TOP_K)


def _rounded_counts(counts, num_tokens, tile, rule):
    """Each expert's token count after rounding to a multiple of tile, at most num_tokens."""
    if rule == "nearest":
        target = (counts + tile // 2) // tile * tile
    elif rule == "up":
        target = (counts + tile - 1) // tile * tile
    else:
        target = counts // tile * tile
    return target.clamp(max=num_tokens)


def _assign_by_sort(probs, chosen, target):
    """The rule as written: rank every token per expert (chosen before not chosen, each by
    probability descending, ties by token index) and keep the first target[e]. Two stable sorts
    instead of one combined key, which would lose the small probabilities."""
    T = probs.shape[0]
    by_prob = probs.argsort(dim=0, descending=True, stable=True)
    not_chosen = (~chosen.gather(0, by_prob)).to(torch.int8)
    order = by_prob.gather(0, not_chosen.argsort(dim=0, stable=True))
    rank = torch.empty_like(order)
    rank.scatter_(0, order, torch.arange(T, device=probs.device).unsqueeze(1).expand_as(order))
    return rank < target.unsqueeze(0)


def _assign_by_bounded_topk(probs, chosen, counts, target, tile):
    """The same assignment as _assign_by_sort, touching only what rounding changes: an expert
    adds its target - count (< tile) best unchosen tokens or drops its count - target (< tile)
    worst chosen ones, so a top-(tile - 1) per expert suffices instead of a sort of all T.
    One int64 key per (token, expert), fp32 probability bits over reversed token index, orders
    like the sort (non-negative floats order as their bits) and makes every key distinct.
    Returns the assignment expert-major (E, T), as it is computed."""
    T, E = probs.shape
    j = min(tile - 1, T)
    if j == 0:
        return chosen.t()
    bits = probs.float().t().contiguous().view(torch.int32).long()  # (E, T)
    reversed_token = torch.arange(T - 1, -1, -1, device=probs.device)
    key = (bits << 32) | reversed_token
    # One top-k for both directions: an expert that adds ranks its unchosen tokens by key, one
    # that drops ranks its chosen tokens by reversed key (worst first); the rest rank at -1.
    adds = (target > counts).unsqueeze(1)
    flip_key = torch.where(adds, key, torch.iinfo(torch.int64).max - key)
    flip_key = flip_key.masked_fill(chosen.t() == adds, -1)
    candidates = flip_key.topk(j, dim=1).indices
    # The first |target - count| candidates flip; they are distinct, so scatter_ is exact.
    wanted = torch.arange(j, device=probs.device) < (target - counts).abs().unsqueeze(1)
    flips = torch.zeros(E, T, dtype=torch.bool, device=probs.device)
    flips.scatter_(1, candidates, wanted)
    return chosen.t() ^ flips


class DenseRoutingMetadata(NamedTuple):
    """Sorted layout of a dense (T, E) assignment whose size is known only on the device (token
    rounding), in buffers of a fixed upper bound of rows, row_bound.

    expert_offsets: (E+1,) int32; expert e owns rows [off[e], off[e+1]); off[E] = M, the number
        of assigned (token, expert) pairs, <= row_bound. Kernels run with partial_rows.
    gather_idx: (row_bound,) int32; sorted row -> token (0 past M).
    token_offsets: (T+1,) int32; token t's entries are [token_offsets[t], token_offsets[t+1]).
    rows: (row_bound,) int32; entry -> sorted row, tokens in order, experts ascending within one.
    row_scores: (row_bound,) fp32; entry -> its score (0 past M).
    sorted_scores: (row_bound,) fp32; sorted row -> its score (0 past M), for the backward's K4.
    """

    expert_offsets: torch.Tensor
    gather_idx: torch.Tensor
    token_offsets: torch.Tensor
    rows: torch.Tensor
    row_scores: torch.Tensor
    sorted_scores: torch.Tensor


def dense_row_bound(num_tokens: int, num_experts: int, top_k: int, tile: int) -> int:
    """Rows token rounding can assign: top-K's T*K plus fewer than `tile` per expert, at most T*E."""
    return min(num_tokens * top_k + num_experts * (tile - 1), num_tokens * num_experts)


def dense_routing_metadata(scores: torch.Tensor, assigned: torch.Tensor, row_bound: int) -> DenseRoutingMetadata:
    """DenseRoutingMetadata of scores (T, E) and assigned (T, E) bool, with no host sync: every
    tensor's size follows from the shapes and row_bound. Scores are read only where assigned.
    On CUDA the dense_layout kernels build it; elsewhere the assigned pairs are listed by
    nonzero_static (fixed size, no sync) twice: of assigned.T, expert-major, which is the sorted
    layout, and of assigned, token-major, which is the entry order."""
    return dense_routing_metadata_expert_major(scores.t(), assigned.t(), row_bound)


def dense_routing_metadata_expert_major(scores_t: torch.Tensor, assigned_t: torch.Tensor,
                                        row_bound: int) -> DenseRoutingMetadata:
    """dense_routing_metadata from expert-major (E, T) scores and assignment (the kernels' layout,
    so no transpose is made when they are contiguous)."""
    E, T = assigned_t.shape
    if assigned_t.dtype != torch.bool:  # the kernels' mask type; any 0 / 1 mask means the same
        assigned_t = assigned_t.bool()
    if on_kernels(assigned_t) and _fits_routing_kernels(T, E):  # token_rounding.cu
        return DenseRoutingMetadata(*dense_layout(assigned_t.contiguous(),
                                                  scores_t.detach().float().contiguous(), row_bound))
    return dense_routing_metadata_by_torch(scores_t, assigned_t, row_bound)


def dense_routing_metadata_by_torch(scores_t: torch.Tensor, assigned_t: torch.Tensor,
                                    row_bound: int) -> DenseRoutingMetadata:
    """dense_routing_metadata_expert_major in torch ops (no kernel): the CPU path, and what the
    dense_layout kernels must match."""
    E, T = assigned_t.shape
    assigned, scores = assigned_t.t(), scores_t.t()
    device = assigned.device
    ones = assigned.to(torch.int32)
    expert_offsets = torch.zeros(E + 1, dtype=torch.int32, device=device)
    expert_offsets[1:] = ones.sum(dim=0, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    token_offsets = torch.zeros(T + 1, dtype=torch.int32, device=device)
    token_offsets[1:] = ones.sum(dim=1, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    valid = torch.arange(row_bound, device=device) < expert_offsets[-1]  # the first M slots
    flat_scores = scores.detach().float()

    by_expert = torch.nonzero_static(assigned.t(), size=row_bound, fill_value=0)  # (e, t) per row
    gather_idx = by_expert[:, 1].to(torch.int32)
    sorted_scores = torch.where(valid, flat_scores[by_expert[:, 1], by_expert[:, 0]], 0.0)

    by_token = torch.nonzero_static(assigned, size=row_bound, fill_value=0)  # (t, e) per entry
    t, e = by_token[:, 0], by_token[:, 1]
    # Entry (t, e) sits at expert e's first row plus the assigned tokens of e before t. The scan
    # runs along the contiguous dim of the transpose: torch's outer-dim scan of (T, E) took
    # ~6 ms at T=16384, E=512 on the H200.
    rank = ones.t().contiguous().cumsum(dim=1, dtype=torch.int32)[e, t] - 1
    rows = torch.where(valid, expert_offsets[e] + rank, 0)
    row_scores = torch.where(valid, flat_scores[t, e], 0.0)
    # Entries past M point at row 0 with score 0.
    return DenseRoutingMetadata(expert_offsets, gather_idx, token_offsets, rows, row_scores, sorted_scores)
