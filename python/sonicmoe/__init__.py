"""SonicMoE: fast, memory-lean Mixture-of-Experts training kernels for Hopper and Blackwell GPUs.

Kernels: routing (R), the fused up-projection (K1: gather + grouped GEMM + a gated activation,
SwiGLU, GeGLU or ReGLU), the grouped GEMMs (K2, K6), combine (K3, K8), the backward through the
down-projection and the gated activation (K4) and the expert weight gradients (K5, K7); the
pure-PyTorch reference MoE; and sonicmoe.moe / moe_routed / MoE on top of them (sonicmoe.functional).
"""

from . import parallel, reference
from ._ops import (GEMM_TILE_CONFIGS, GLU_ACTIVATIONS, VARLEN_TILE_CONFIGS, autotune_cache_path, autotune_clear,
                   combine, combine_csr, combine_dx, device_routing_metadata, down_proj_grad, extension_available,
                   grouped_gemm, grouped_gemm_kn, h_column_order, kernel_archs, router_topk, scatter_rows, up_proj,
                   weight_grad)
from .functional import moe, moe_routed
from .layer import MoE
from .routing import RoutingMetadata, routing_metadata

__all__ = [
    "GEMM_TILE_CONFIGS",
    "GLU_ACTIVATIONS",
    "VARLEN_TILE_CONFIGS",
    "MoE",
    "build_info",
    "RoutingMetadata",
    "autotune_cache_path",
    "autotune_clear",
    "combine",
    "combine_csr",
    "combine_dx",
    "device_routing_metadata",
    "down_proj_grad",
    "extension_available",
    "grouped_gemm",
    "grouped_gemm_kn",
    "h_column_order",
    "kernel_archs",
    "moe",
    "moe_routed",
    "parallel",
    "reference",
    "router_topk",
    "routing_metadata",
    "scatter_rows",
    "up_proj",
    "weight_grad",
]
try:  # a built wheel: its version names the CUDA, torch and archs it was built for
    from ._build_info import BUILD_INFO as _BUILD_INFO
    from ._build_info import VERSION as __version__
except ImportError:  # the source tree (an in-place build)
    from .version import __version__
    _BUILD_INFO = None


def build_info():
    """What the installed wheel was built for ({"cuda", "torch", "archs"}), or None in a source tree."""
    return dict(_BUILD_INFO) if _BUILD_INFO else None
