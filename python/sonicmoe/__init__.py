"""SonicMoE: fast, memory-lean Mixture-of-Experts training kernels for Hopper GPUs.

Landed so far: the varlen-M grouped GEMM (K2), the combine kernel (K3), the pure-PyTorch
reference MoE and the routing metadata helpers. The fused layer (sonicmoe.moe / MoE) follows in later releases.
"""

from . import reference
from ._ops import GEMM_TILE_CONFIGS, combine, extension_available, grouped_gemm
from .routing import RoutingMetadata, routing_metadata

__all__ = [
    "GEMM_TILE_CONFIGS",
    "RoutingMetadata",
    "combine",
    "extension_available",
    "grouped_gemm",
    "reference",
    "routing_metadata",
]
__version__ = "0.1.0"
