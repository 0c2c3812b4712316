"""sonicmoe.MoE: an nn.Module holding the router and the experts in the public layout."""

from __future__ import annotations

import math

import torch
from torch import nn

from . import reference
from ._ops import check_activation
from .functional import moe

__all__ = ["MoE"]


class MoE(nn.Module):
    """Mixture-of-Experts block with gated experts (docs/design.md §2): A = act(gate) * up, act by
    activation: "swiglu" (silu, the default), "geglu" (GELU's tanh form) or "reglu" (relu).

    Parameters, in the Hugging Face / torchtitan layout so weights drop in:
    router_weight (E, d); w1 (E, 2n, d), rows [0, n) gate and [n, 2n) up; w2 (E, d, n).

    routing="token_rounding" is training-time routing (options tile, rule); in eval mode the
    layer routes by plain top-K of the softmax probabilities ("softmax_topk"), the scores
    token rounding keeps.

    return_router_logits=True makes forward return (out, router_logits), the logits (T, E) over
    the flattened tokens, as Hugging Face's MoE blocks do for their load-balancing loss.
    """

    def __init__(self, hidden_size, intermediate_size, num_experts, top_k,
                 routing="topk_softmax", tile=128, rule="nearest", device=None, dtype=None,
                 return_router_logits=False, activation="swiglu"):
        super().__init__()
        reference._check_routing(routing, dense_ok=True)
        self.activation = check_activation(activation)
        self.top_k = reference._check_top_k(top_k, num_experts)
        self.routing = routing
        self.tile = tile
        self.rule = rule
        self.return_router_logits = return_router_logits
        factory = {"device": device, "dtype": dtype}
        d, n, E = hidden_size, intermediate_size, num_experts
        self.router_weight = nn.Parameter(torch.empty(E, d, **factory))
        self.w1 = nn.Parameter(torch.empty(E, 2 * n, d, **factory))
        self.w2 = nn.Parameter(torch.empty(E, d, n, **factory))
        self.reset_parameters()

    def reset_parameters(self):
        # nn.Linear's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) per projection.
        for weight, fan_in in ((self.router_weight, self.w1.shape[2]), (self.w1, self.w1.shape[2]),
                               (self.w2, self.w2.shape[2])):
            bound = 1.0 / math.sqrt(fan_in)
            nn.init.uniform_(weight, -bound, bound)

    def forward(self, x):
        routing = self.routing
        if routing == "token_rounding" and not self.training:
            routing = "softmax_topk"
        return moe(x, self.router_weight, self.w1, self.w2, self.top_k, routing=routing,
                   tile=self.tile, rule=self.rule, return_router_logits=self.return_router_logits,
                   activation=self.activation)

    def extra_repr(self):
        E, d, n = self.w2.shape
        return (f"hidden_size={d}, intermediate_size={n}, num_experts={E}, top_k={self.top_k}, "
                f"routing={self.routing!r}, activation={self.activation!r}")
