"""Pure-PyTorch MoE in the public layout (docs/design.md §2): the ground truth for every kernel.

Runs on CPU or GPU, computes in the dtype of its inputs and is differentiable through
plain autograd. It favours clarity over speed and, unlike the kernels, may sync with
the host (it reads per-expert token counts to slice the sorted rows).
"""

from __future__ import annotations

import math
import operator

import torch
import torch.nn.functional as F

from ._ops import GLU_ACTIVATIONS, check_activation
from .routing import RoutingMetadata, scores_from_logits, token_rounding

__all__ = [
    "ROUTING_MODES",
    "route",
    "route_token_rounding",
    "moe_routed",
    "moe_dense_routed",
    "moe",
    "up_projection",
    "expert_backward",
    "GLU_ACTIVATIONS",
    "glu_activation",
    "glu_activation_grad",
    "glu",
    "glu_backward",
]

ROUTING_MODES = ("topk_softmax", "softmax_topk", "softmax_topk_norm")
# Token rounding gives each token a variable number of experts: dense (T, E) routing.
DENSE_ROUTING_MODES = ("token_rounding",)


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def _check_routing(routing: str, dense_ok: bool = False) -> None:
    if routing in DENSE_ROUTING_MODES and not dense_ok:
        raise ValueError(
            f"routing={routing!r} gives each token a variable number of experts, so it has no "
            "(T, K) form: use route_token_rounding(), which returns dense (T, E) scores"
        )
    allowed = ROUTING_MODES + (DENSE_ROUTING_MODES if dense_ok else ())
    if routing not in allowed:
        raise ValueError(f"routing: expected one of {allowed}, got {routing!r}")


def _check_top_k(top_k: int, num_experts: int) -> int:
    try:
        top_k = operator.index(top_k)
    except TypeError:
        raise TypeError(f"top_k: expected an int, got {top_k!r}") from None
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k: expected 1 <= top_k <= E = {num_experts}, got {top_k}")
    return top_k


def _check_same_dtype(name: str, t: torch.Tensor, x: torch.Tensor) -> None:
    if t.dtype != x.dtype:
        raise ValueError(f"{name}: expected dtype {x.dtype} (the dtype of x), got {t.dtype}")


# GELU's tanh form: 0.5 g (1 + tanh(c (g + k g^3))), c = sqrt(2 / pi), as F.gelu(g, approximate="tanh").
_GELU_TANH_C = math.sqrt(2.0 / math.pi)
_GELU_TANH_K = 0.044715


def glu_activation(gate: torch.Tensor, activation: str = "swiglu") -> torch.Tensor:
    """act(gate) of the gated activation (GLU_ACTIVATIONS): silu for "swiglu", GELU's tanh form
    for "geglu", relu for "reglu"; differentiable through autograd."""
    check_activation(activation)
    if activation == "swiglu":
        return F.silu(gate)
    if activation == "geglu":
        return F.gelu(gate, approximate="tanh")
    return F.relu(gate)


def glu_activation_grad(gate: torch.Tensor, activation: str = "swiglu") -> torch.Tensor:
    """act'(gate), analytically, as K4's epilogue computes it: silu' = sig (1 + g (1 - sig));
    GELU-tanh' = 0.5 (1 + t) + 0.5 g (1 - t^2) c (1 + 3 k g^2), t = tanh(c (g + k g^3));
    relu' = 1 where g > 0, else 0."""
    check_activation(activation)
    if activation == "swiglu":
        sig = torch.sigmoid(gate)
        return sig * (1 + gate * (1 - sig))
    if activation == "geglu":
        t = torch.tanh(_GELU_TANH_C * (gate + _GELU_TANH_K * gate * gate * gate))
        return 0.5 * (1 + t) + 0.5 * gate * (1 - t * t) * _GELU_TANH_C * (1 + 3 * _GELU_TANH_K * gate * gate)
    return (gate > 0).to(gate.dtype)


def glu(h: torch.Tensor, activation: str = "swiglu") -> torch.Tensor:
    """A = act(gate) * up for H = [gate | up] (rows, 2n) in column order: K1's epilogue math."""
    n = h.shape[-1] // 2
    return glu_activation(h[..., :n], activation) * h[..., n:]


def route(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    top_k: int,
    routing: str = "topk_softmax",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-K token-choice routing.

    Args:
        x: (T, d) tokens.
        router_weight: (E, d); logits = x @ router_weight.T.
        top_k: K, experts per token, 1 <= K <= E.
        routing: one of ROUTING_MODES.

    Returns:
        scores (T, K) in the dtype of x and experts (T, K) int64, ordered by
        decreasing score.
    """
    _check_routing(routing)
    if x.dim() != 2:
        raise ValueError(f"x: expected a 2-D tensor (T, d), got shape {_shape(x)}")
    d = x.shape[1]
    if router_weight.dim() != 2 or router_weight.shape[1] != d:
        raise ValueError(
            f"router_weight: expected shape (E, d) with d = {d}, got {_shape(router_weight)}"
        )
    _check_same_dtype("router_weight", router_weight, x)
    top_k = _check_top_k(top_k, router_weight.shape[0])

    return scores_from_logits(x @ router_weight.T, top_k, routing)


def _check_expert_weights(x, w1, w2) -> tuple[int, int, int, int]:
    """x (T, d), w1 (E, 2n, d), w2 (E, d, n); returns (T, d, E, n)."""
    if x.dim() != 2:
        raise ValueError(f"x: expected a 2-D tensor (T, d), got shape {_shape(x)}")
    T, d = x.shape
    if w2.dim() != 3 or w2.shape[1] != d:
        raise ValueError(f"w2: expected shape (E, d, n) with d = {d}, got {_shape(w2)}")
    E, _, n = w2.shape
    if _shape(w1) != (E, 2 * n, d):
        raise ValueError(f"w1: expected shape (E, 2n, d) = {(E, 2 * n, d)}, got {_shape(w1)}")
    return T, d, E, n


def check_routed_args(x, w1, w2, scores, experts) -> None:
    """Shape and dtype-kind rules of moe_routed, shared with sonicmoe.moe_routed (no data read)."""
    T = _check_expert_weights(x, w1, w2)[0]
    if scores.dim() != 2 or scores.shape[0] != T:
        raise ValueError(f"scores: expected shape (T, K) with T = {T}, got {_shape(scores)}")
    if not scores.is_floating_point():
        raise ValueError(f"scores: expected a floating-point dtype, got {scores.dtype}")
    if _shape(experts) != _shape(scores):
        raise ValueError(f"experts: expected shape (T, K) = {_shape(scores)}, got {_shape(experts)}")
    if experts.is_floating_point() or experts.is_complex() or experts.dtype == torch.bool:
        raise ValueError(f"experts: expected an integer dtype, got {experts.dtype}")


def moe_routed(
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    scores: torch.Tensor,
    experts: torch.Tensor,
    *,
    activation: str = "swiglu",
) -> torch.Tensor:
    """Expert MLPs (gated: SwiGLU, GeGLU or ReGLU) for given routing decisions.

    Args:
        x: (T, d) tokens (callers flatten leading batch dims).
        w1: (E, 2n, d); rows [0, n) gate, rows [n, 2n) up.
        w2: (E, d, n) down projection.
        scores: (T, K) routing weights; gradients flow into them.
        experts: (T, K) integer expert ids in [0, E).
        activation: one of GLU_ACTIVATIONS (glu_activation).

    Returns:
        (T, d): out[t] = sum_k scores[t, k] * w2[e] @ (act(h_gate) * h_up),
        h = w1[e] @ x[t], e = experts[t, k].
    """
    check_activation(activation)
    check_routed_args(x, w1, w2, scores, experts)
    T, d = x.shape
    E, _, n = w2.shape
    K = scores.shape[1]
    _check_same_dtype("w1", w1, x)
    _check_same_dtype("w2", w2, x)
    if experts.numel() > 0:
        lo, hi = (int(v) for v in torch.aminmax(experts))
        if lo < 0 or hi >= E:
            # Out-of-range ids would otherwise be dropped silently by the split below.
            raise ValueError(
                f"experts: expected ids in [0, E) = [0, {E}), got values in [{lo}, {hi}]"
            )

    # Sorted layout (docs/design.md §4): rows grouped by expert, (token, k) order within one.
    flat = experts.reshape(-1).long()
    order = torch.sort(flat, stable=True).indices
    counts = torch.bincount(flat, minlength=E).tolist()
    x_sorted = x[order // max(K, 1)]

    # Every expert runs, even with zero rows, so w1 and w2 always get a gradient
    # tensor (zero for idle experts) rather than None.
    ys = []
    for e, rows in enumerate(x_sorted.split(counts)):
        h = rows @ w1[e].T
        ys.append(glu(h, activation) @ w2[e].T)
    y_sorted = torch.cat(ys) if ys else x.new_zeros(0, d)

    # Undo the sort and combine by gathering, not scattering: deterministic, like K3.
    y = y_sorted[torch.argsort(order)].view(T, K, d)
    return torch.einsum("tk,tkd->td", scores.to(y.dtype), y)


def route_token_rounding(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    top_k: int,
    tile: int = 128,
    rule: str = "nearest",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-rounding routing (docs/design.md §6): dense scores (T, E) and assignment mask (T, E).

    See sonicmoe.routing.token_rounding for the rule; logits = x @ router_weight.T.
    """
    if x.dim() != 2:
        raise ValueError(f"x: expected a 2-D tensor (T, d), got shape {_shape(x)}")
    if router_weight.dim() != 2 or router_weight.shape[1] != x.shape[1]:
        raise ValueError(
            f"router_weight: expected shape (E, d) with d = {x.shape[1]}, got {_shape(router_weight)}"
        )
    _check_same_dtype("router_weight", router_weight, x)
    top_k = _check_top_k(top_k, router_weight.shape[0])
    return token_rounding(x @ router_weight.T, top_k, tile, rule)


def moe_dense_routed(
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    scores: torch.Tensor,
    assigned: torch.Tensor,
    *,
    activation: str = "swiglu",
) -> torch.Tensor:
    """Expert MLPs for dense routing: out[t] = sum over e with assigned[t, e] of
    scores[t, e] * w2[e] @ (act(h_gate) * h_up), h = w1[e] @ x[t]. scores, assigned: (T, E);
    activation as in moe_routed."""
    check_activation(activation)
    T, d, E, n = _check_expert_weights(x, w1, w2)
    for name, t in (("scores", scores), ("assigned", assigned)):
        if _shape(t) != (T, E):
            raise ValueError(f"{name}: expected shape (T, E) = {(T, E)}, got {_shape(t)}")
    if assigned.dtype != torch.bool:
        raise ValueError(f"assigned: expected dtype torch.bool, got {assigned.dtype}")

    # Every expert runs (zero rows included) so w1 and w2 always get a gradient tensor.
    parts, rows = [], []
    for e in range(E):
        tokens = assigned[:, e].nonzero().squeeze(1)
        h = x[tokens] @ w1[e].T
        parts.append(scores[tokens, e].to(x.dtype).unsqueeze(1) * (glu(h, activation) @ w2[e].T))
        rows.append(tokens)
    return x.new_zeros(T, d).index_add(0, torch.cat(rows), torch.cat(parts))


def moe(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    top_k: int,
    routing: str = "topk_softmax",
    *,
    tile: int = 128,
    rule: str = "nearest",
    activation: str = "swiglu",
) -> torch.Tensor:
    """Full MoE layer: route, then the expert MLPs. x is (..., d); the output has x's shape.

    tile and rule apply to routing="token_rounding" only; activation as in moe_routed.
    """
    _check_routing(routing, dense_ok=True)
    check_activation(activation)
    if x.dim() < 1:
        raise ValueError(f"x: expected shape (..., d), got shape {_shape(x)}")
    d = x.shape[-1]
    if router_weight.dim() != 2 or router_weight.shape[1] != d:
        raise ValueError(
            f"router_weight: expected shape (E, d) with d = {d}, got {_shape(router_weight)}"
        )
    E = router_weight.shape[0]
    if w2.dim() != 3 or w2.shape[:2] != (E, d):
        raise ValueError(f"w2: expected shape (E, d, n) with (E, d) = {(E, d)}, got {_shape(w2)}")

    x2 = x.reshape(-1, d)
    if routing == "token_rounding":
        scores, assigned = route_token_rounding(x2, router_weight, top_k, tile, rule)
        return moe_dense_routed(x2, w1, w2, scores, assigned, activation=activation).reshape(x.shape)
    scores, experts = route(x2, router_weight, top_k, routing)
    return moe_routed(x2, w1, w2, scores, experts, activation=activation).reshape(x.shape)


# ------------------------------------------------------------------------------------------
# The layer the way the kernels split it (docs/design.md §3-4): what K1 keeps for backward, and the
# backward computed from only x, H, the scores and the routing metadata. These are the
# specification of K1 and K4-K8 (each step names its kernel); plain PyTorch, any device, in
# fp32 or the inputs' dtype if wider. They read the offsets on the host, like the rest of this
# module.


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)


def up_projection(x: torch.Tensor, w1: torch.Tensor, meta: RoutingMetadata) -> torch.Tensor:
    """H (T*K, 2n) in the sorted layout: H[r] = w1[e] @ x[gather_idx[r]] for rows r of expert e
    (K1's product before its gated activation's epilogue; what the forward keeps)."""
    dtype = _compute_dtype(x)
    xs = x.to(dtype)[meta.gather_idx.long()]
    h = xs.new_empty(xs.shape[0], w1.shape[1])
    bounds = meta.expert_offsets.tolist()
    for e in range(w1.shape[0]):
        lo, hi = bounds[e], bounds[e + 1]
        h[lo:hi] = xs[lo:hi] @ w1[e].to(dtype).T
    return h


def glu_backward(h: torch.Tensor, d_a: torch.Tensor, activation: str = "swiglu") -> torch.Tensor:
    """dH = dGLU(dA, H): the gradient through a = act(gate) * up, for H = [gate | up] (rows, 2n)
    in column order and dA (rows, n): [dA * up * act'(gate), dA * act(gate)], act' analytic
    (glu_activation_grad); K4's epilogue math."""
    n = d_a.shape[1]
    gate, up = h[:, :n], h[:, n:]
    return torch.cat([d_a * up * glu_activation_grad(gate, activation), d_a * glu_activation(gate, activation)],
                     dim=1)


def expert_backward(
    x: torch.Tensor,
    h: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    scores: torch.Tensor,
    meta: RoutingMetadata,
    grad_out: torch.Tensor,
    activation: str = "swiglu",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of moe_routed from x, H, the scores and the metadata only: no Y, no A and no
    gathered x or dO are kept from the forward (docs/design.md §3).

    x (T, d); h (T*K, 2n) sorted layout (up_projection); w1 (E, 2n, d); w2 (E, d, n);
    scores (T, K); meta from routing_metadata(experts, E); grad_out (T, d); activation the
    forward's (GLU_ACTIVATIONS).
    Returns dx (T, d), dw1 (E, 2n, d), dw2 (E, d, n), dscores (T, K), in the compute dtype.
    An expert with no rows gets exactly zero weight gradients.
    """
    dtype = _compute_dtype(x)
    T, d = x.shape
    E, _, n = w2.shape
    K = scores.shape[1]
    rows = meta.rev_idx.reshape(-1).long()      # (t, k) -> sorted row
    tokens = meta.gather_idx.long()             # sorted row -> t
    M = tokens.numel()
    row_score = scores.to(dtype).reshape(-1).new_empty(M)
    row_score[rows] = scores.to(dtype).reshape(-1)
    bounds = meta.expert_offsets.tolist()
    w1c, w2c, hc = w1.to(dtype), w2.to(dtype), h.to(dtype)

    # K4: dA' = dO[gather] @ w2[e] (the gather is in the A load), then the epilogue:
    # recompute A from H, dS = <dA', A> per row, dH = dGLU(s * dA', H), A' = s * A.
    d_out = grad_out.to(dtype)[tokens]
    d_a_prime = d_out.new_empty(M, n)
    for e in range(E):
        lo, hi = bounds[e], bounds[e + 1]
        d_a_prime[lo:hi] = d_out[lo:hi] @ w2c[e]
    a = glu(hc, activation)
    d_score_rows = (d_a_prime * a).sum(dim=1)
    d_h = glu_backward(hc, row_score.unsqueeze(1) * d_a_prime, activation)
    a_scaled = row_score.unsqueeze(1) * a

    # K5: dW2[e] = dO[gather]^T A'; K7: dW1[e] = dH^T x[gather] (varlen-K, gather along K);
    # K6: dX~ = dH @ w1[e] (varlen-M).
    xs = x.to(dtype)[tokens]
    dw1 = w1c.new_zeros(w1.shape)
    dw2 = w2c.new_zeros(w2.shape)
    d_x_rows = d_out.new_empty(M, d)
    for e in range(E):
        lo, hi = bounds[e], bounds[e + 1]
        if hi > lo:
            dw2[e] = d_out[lo:hi].T @ a_scaled[lo:hi]
            dw1[e] = d_h[lo:hi].T @ xs[lo:hi]
        d_x_rows[lo:hi] = d_h[lo:hi] @ w1c[e]

    # K8: dX[t] = sum_k dX~[rev_idx[t, k]] (gather-and-sum, fixed order); dS back to (T, K).
    dx = d_x_rows[rows].view(T, K, d).sum(dim=1)
    dscores = d_score_rows[rows].view(T, K)
    return dx, dw1, dw2, dscores
