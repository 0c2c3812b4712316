"""SonicMoE: fast, memory-lean Mixture-of-Experts training kernels for Hopper GPUs.

Landed so far: the fused up-projection (K1: gather + grouped GEMM + SwiGLU), the varlen-M
grouped GEMM (K2), the combine kernel (K3), the pure-PyTorch reference MoE, the routing
metadata helpers, and sonicmoe.moe / moe_routed / MoE on top of them (interim backward: see
sonicmoe.functional).
"""

from . import reference
from ._ops import (GEMM_TILE_CONFIGS, combine, combine_csr, device_routing_metadata, down_proj_grad,
                   extension_available, grouped_gemm, grouped_gemm_kn, router_topk, up_proj)
from .functional import moe, moe_routed
from .layer import MoE
from .routing import RoutingMetadata, routing_metadata

__all__ = [
    "GEMM_TILE_CONFIGS",
    "MoE",
    "RoutingMetadata",
    "combine",
    "combine_csr",
    "device_routing_metadata",
    "down_proj_grad",
    "extension_available",
    "grouped_gemm",
    "grouped_gemm_kn",
    "moe",
    "moe_routed",
    "reference",
    "router_topk",
    "routing_metadata",
    "up_proj",
]
__version__ = "0.1.0"
