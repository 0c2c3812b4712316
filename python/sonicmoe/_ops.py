"""Loads the compiled ops (torch.ops.sonicmoe.*) and registers a fake beside each wrapper."""

from __future__ import annotations

import torch

try:
    from . import _C  # noqa: F401  (importing registers torch.ops.sonicmoe)
except ImportError as exc:  # pragma: no cover - depends on the build
    _C = None
    _IMPORT_ERROR = exc
else:
    _IMPORT_ERROR = None

# Tile configurations of the sm90 grouped GEMM (csrc/sonicmoe.h, GemmTileConfig).
GEMM_TILE_CONFIGS = {
    "auto": 0,
    "pingpong_128x128x64_c2x1": 1,
    "pingpong_64x128x128_c2x1": 2,
    "cooperative_128x256x64_c2x1": 3,
    "cooperative_256x128x64_c2x1": 4,
    "pingpong_128x128x128_c2x1": 5,
    "pingpong_128x128x64_c1x1": 6,
    "varlen_pingpong_128x128x64": 7,
    "varlen_cooperative_128x256x64": 8,
    "varlen_cooperative_256x128x64": 9,
    "varlen_cooperative_128x256x64_c2x1": 10,
    "varlen_pingpong_128x128x64_c2x1": 11,
    "varlen_pingpong_128x192x64": 12,  # grouped_gemm and grouped_gemm_kn (K2, K6) only
}
# The varlen kernel's configurations every varlen op takes (up_proj, down_proj_grad, grouped_gemm_kn,
# weight_grad within its own rules); grouped_gemm_kn also takes "varlen_pingpong_128x192x64", grouped_gemm
# that and the rest (csrc/sonicmoe.h, is_varlen_config, is_grouped_gemm_only_config).
VARLEN_TILE_CONFIGS = ("varlen_pingpong_128x128x64", "varlen_cooperative_128x256x64", "varlen_cooperative_256x128x64",
                       "varlen_cooperative_128x256x64_c2x1", "varlen_pingpong_128x128x64_c2x1")


# The gated activations of K1's and K4's epilogues (csrc/sonicmoe.h, GluActivation): A = act(gate) * up
# with act silu (SwiGLU), GELU in its tanh form (GeGLU, F.gelu(g, approximate="tanh")) or relu (ReGLU).
GLU_ACTIVATIONS = {"swiglu": 0, "geglu": 1, "reglu": 2}


def check_activation(activation) -> str:
    """activation as the layer takes it (one of GLU_ACTIVATIONS), or a ValueError naming the rule."""
    if not isinstance(activation, str) or activation not in GLU_ACTIVATIONS:
        allowed = ", ".join(repr(a) for a in GLU_ACTIVATIONS)
        raise ValueError(f"activation = {activation!r} breaks the rule: must be one of {allowed} (gated "
                         "activations; non-gated ones such as 'relu2' and 'gelu' are not supported)")
    return activation


def _activation_number(activation: str) -> int:
    return GLU_ACTIVATIONS[check_activation(activation)]


def extension_available() -> bool:
    return _C is not None


# The device types whose tensors the ops run on: CUDA. The CPU tests of the Python layer add "cpu"
# while an emulation of every op is registered for CPU tensors (tests/python/kernel_emulation.py),
# so a machine without a GPU runs the layer's kernel path: its autograd Functions, the metadata
# they pass between ops, the fakes under torch.compile.
KERNEL_DEVICE_TYPES = {"cuda"}


def kernel_archs() -> tuple[int, ...]:
    """The kernel archs of the built extension (SONICMOE_CUDA_ARCHS): 90 for sm_90a, 100 for
    sm_100a; () without the extension. Either holds every op."""
    return tuple(torch.ops.sonicmoe.kernel_archs()) if _C is not None else ()


def on_kernels(t: torch.Tensor) -> bool:
    """Whether the ops run on tensors like t: the extension is built and t is on a kernel device."""
    return _C is not None and t.device.type in KERNEL_DEVICE_TYPES


def _require_extension() -> None:
    if _C is None:
        raise RuntimeError(
            "sonicmoe._C is not built; build it with `python setup.py build_ext --inplace` "
            f"(import failed with: {_IMPORT_ERROR})"
        )


def grouped_gemm(
    a: torch.Tensor, b: torch.Tensor, expert_offsets: torch.Tensor, tile_config: str = "auto",
    partial_rows: bool = False,
) -> torch.Tensor:
    """Varlen-M grouped GEMM: out[r] = a[r] @ b[e].T for rows r in expert e's range.

    a: (M_total, k) bf16, rows sorted by expert; b: (E, n_out, k) bf16 (the w2 layout);
    expert_offsets: (E+1,) int32 on the device. Returns (M_total, n_out) bf16.
    partial_rows: expert_offsets[E] may stop short of M_total (rows past it are not written).
    On a Blackwell sm_100 GPU (a build with SONICMOE_CUDA_ARCHS="90a;100a"): tile_config "auto"
    only (CUTLASS's sm100 ptr-array kernel, chosen by rule; partial_rows too).
    """
    _require_extension()
    return torch.ops.sonicmoe.grouped_gemm(a, b, expert_offsets, _tile_config_number(tile_config), partial_rows)


def _tile_config_number(tile_config: str) -> int:
    if tile_config not in GEMM_TILE_CONFIGS:
        raise ValueError(f"tile_config: {tile_config!r} is not one of {sorted(GEMM_TILE_CONFIGS)}")
    return GEMM_TILE_CONFIGS[tile_config]


def grouped_gemm_kn(a: torch.Tensor, b: torch.Tensor, expert_offsets: torch.Tensor,
                    partial_rows: bool = False, tile_config: str = "auto",
                    addend_scale: torch.Tensor | None = None, addend_rows: torch.Tensor | None = None) -> torch.Tensor:
    """K6 layout: out[r] = a[r] @ b[e] for rows r of expert e, b (E, k, n_out) bf16 read as stored
    (dX~ = dH @ w1 with w1 (E, 2n, d)); our varlen kernel. partial_rows as in grouped_gemm;
    tile_config "auto", a varlen configuration (VARLEN_TILE_CONFIGS) or "varlen_pingpong_128x192x64".
    With addend_scale (M,) fp32 and addend_rows (E, n_out) bf16 (both or neither), out[r] +=
    addend_scale[r] * addend_rows[e] in fp32 before the one rounding: the router's part of dx where
    d_logits is zero off the chosen experts (router_backward_rows' d_logit_rows, router_weight).
    On a Blackwell sm_100 GPU: as grouped_gemm there (tile_config "auto" only, partial_rows too), the
    addend included (fused in the epilogue of CUTLASS's sm100 ptr-array kernel)."""
    _require_extension()
    return torch.ops.sonicmoe.grouped_gemm_kn(a, b, expert_offsets, partial_rows, _tile_config_number(tile_config),
                                              addend_scale, addend_rows)


def down_proj_grad(d_out, w2, h, row_score, expert_offsets, gather_idx, partial_rows=False, tile_config="auto",
                   activation="swiglu"):
    """K4: gradient through the down-projection and the gated activation from H (sonicmoe.h,
    DownProjGradParams); activation as in up_proj (the forward's).

    h is up_proj's, in the kernels' column order (h_column_order). Returns d_h (M, 2n) bf16 in
    column order, a_scaled = s * A (M, n) bf16 and d_score_partial (M, ceil(n/128))
    fp32, whose row sums are dS = <dA', A>. partial_rows as in grouped_gemm (rows past
    expert_offsets[E] are not written, but for the first 64 of d_h and a_scaled, which are zeros:
    weight_grad's cooperative tiles read them); tile_config "auto" or a varlen configuration, as
    in up_proj."""
    _require_extension()
    return torch.ops.sonicmoe.down_proj_grad(d_out, w2, h, row_score, expert_offsets, gather_idx,
                                             partial_rows, _tile_config_number(tile_config),
                                             _activation_number(activation))


def weight_grad(a, b, expert_offsets, gather_idx, gather_a, partial_rows=False, tile_config="auto", sm_margin=0,
                rows_past_end_zeroed=False):
    """K5 / K7: per expert e, out[e] = sum over its sorted rows r of a_row(r)^T b_row(r), fp32
    accumulation, bf16 (E, a.shape[1], b.shape[1]). The gathered operand's row r is its row
    gather_idx[r] (a's when gather_a: dW2 = weight_grad(dO, A', ..., True); else b's: dW1 =
    weight_grad(dH, x, ..., False)), gathered inside the kernel's loads. Experts without rows get
    exact zeros. partial_rows as in grouped_gemm. tile_config: "auto", "varlen_pingpong_128x128x64",
    or cooperative with the gathered side 128 wide: "varlen_cooperative_128x256x64" with gather_a,
    "varlen_cooperative_256x128x64" without, "varlen_cooperative_128x256x64_c2x1" either in 2 x 1
    clusters; "auto" chooses by the shape (csrc/sm90/heuristics.h). With partial_rows the
    cooperative tiles read the other operand's first 64 rows past expert_offsets[E] by TMA, which
    must be finite (down_proj_grad's outputs are zero there): "auto" then takes ping-pong's
    cp.async path unless rows_past_end_zeroed says the caller guarantees them (the layer does).
    sm_margin: SMs the persistent grid leaves to work on other streams (0: it takes them all).
    On a Blackwell sm_100 GPU (a build with SONICMOE_CUDA_ARCHS="90a;100a"): tile_config "auto" only
    (the sm100 kernel: the 128-wide gathered side by cp.async, the 256-wide other side by TMA, or by
    cp.async where partial_rows is set without rows_past_end_zeroed or there are no rows; tcgen05
    MMA, one tile); the same results and zeros."""
    _require_extension()
    return torch.ops.sonicmoe.weight_grad(a, b, expert_offsets, gather_idx, gather_a, partial_rows,
                                          _tile_config_number(tile_config), sm_margin, rows_past_end_zeroed)


def rounding_probs(logits, top_k, write_probs):
    """Token rounding's router on R's kernel: the softmax over all E in fp32 of logits (T, E),
    fp32 or bf16, and its top-K choice (R's: ties to the lower expert id), in one pass. Returns
    probs (T, E) fp32 (0 rows unless write_probs), probs_t (E, T) fp32 and chosen_t (E, T) bool,
    the expert-major forms token_rounding_assign and dense_layout take."""
    _require_extension()
    return torch.ops.sonicmoe.rounding_probs(logits, top_k, write_probs)


def token_rounding_assign(probs_t, chosen_t, tile, rule):
    """Token rounding's assignment on the device from expert-major probs_t (E, T) fp32 and the
    top-K choice chosen_t (E, T) bool: (assigned_t (E, T) bool, counts (E,) int32). rule: 0
    nearest, 1 up, 2 down. Same tokens as sonicmoe.routing's sort, ties included."""
    _require_extension()
    return torch.ops.sonicmoe.token_rounding_assign(probs_t, chosen_t, tile, rule)


def dense_layout(assigned_t, scores_t, row_bound):
    """DenseRoutingMetadata fields (expert_offsets, gather_idx, token_offsets, rows, row_scores,
    sorted_scores) of an expert-major assignment (E, T) bool with scores (E, T) fp32, on the
    device (E <= 1024)."""
    _require_extension()
    return torch.ops.sonicmoe.dense_layout(assigned_t, scores_t, row_bound)


def up_proj(
    x: torch.Tensor,
    w1: torch.Tensor,
    expert_offsets: torch.Tensor,
    gather_idx: torch.Tensor,
    keep_h: bool = True,
    partial_rows: bool = False,
    tile_config: str = "auto",
    activation: str = "swiglu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """K1: up-projection with a gated activation, the x rows gathered inside the GEMM.

    For sorted row r of expert e: H[r] = w1[e] @ x[gather_idx[r]] (2n: gate, up) and
    a[r] = act(H[r, :n]) * H[r, n:] from the fp32 accumulators, act by activation (one of
    GLU_ACTIVATIONS): "swiglu" silu, "geglu" GELU's tanh form (F.gelu(g, approximate="tanh")),
    "reglu" relu. x: (T, d) bf16;
    w1: (E, 2n, d) bf16 (public layout); expert_offsets: (E+1,) int32; gather_idx: (M,) int32,
    both from routing_metadata. Returns (h (M, 2n), a (M, n)), bf16: h is H in the kernels'
    column order, which down_proj_grad reads (h_column_order(h) is H); h has 0 rows when
    keep_h is False (inference: H is only kept for backward). tile_config: "auto" or one of the
    varlen kernel's configurations (VARLEN_TILE_CONFIGS; same results). On a Blackwell sm_100 GPU
    (a build with SONICMOE_CUDA_ARCHS="90a;100a"): tile_config "auto" only (the sm100 kernel:
    cp.async gather, tcgen05 MMA, one configuration); h and a as on Hopper.
    """
    _require_extension()
    return torch.ops.sonicmoe.up_proj(x, w1, expert_offsets, gather_idx, keep_h, partial_rows,
                                      _tile_config_number(tile_config), _activation_number(activation))


# H's column blocks (csrc/common/h_column_order.h, kHBlockCols / h_position).
H_BLOCK_COLS = 32


def h_column_order(h: torch.Tensor) -> torch.Tensor:
    """up_proj's h (M, 2n) as H = [gate | up] in column order. The kernels keep each whole
    32-column block of either half in the WGMMA accumulators' order (16-byte chunk l holds the
    block's columns 8 b + 2 l + v at position 2 b + v; csrc/common/h_column_order.h), so K1
    stores and K4 loads it without shuffles; a trailing partial block is in column order. The map
    is its own inverse: h_column_order also turns H into the kernels' order."""
    if h.dim() != 2 or h.shape[1] % 2 != 0:
        raise ValueError(f"h_column_order: h.shape = {list(h.shape)} breaks the rule: must be 2-D (M, 2n)")
    m, two_n = h.shape
    n = two_n // 2
    whole = n // H_BLOCK_COLS * H_BLOCK_COLS
    halves = h.reshape(m, 2, n)
    blocks = halves[:, :, :whole].reshape(m, 2, whole // H_BLOCK_COLS, 4, 4, 2).transpose(3, 4)
    return torch.cat([blocks.reshape(m, 2, whole), halves[:, :, whole:]], dim=2).reshape(m, two_n)


# Routing modes of the router kernel (csrc/sonicmoe.h, RouterMode).
ROUTER_MODES = {"topk_softmax": 0, "softmax_topk": 1, "softmax_topk_norm": 2}
# Limits of the router_topk kernel (csrc/kernels/routing.cu: kMaxRouterExperts, kMaxRouterTopK).
ROUTER_MAX_EXPERTS, ROUTER_MAX_TOP_K = 1024, 32


def router_topk(logits: torch.Tensor, top_k: int, routing: str) -> tuple[torch.Tensor, torch.Tensor]:
    """R: top-K scores (T, K) fp32 and experts (T, K) int32 from logits (T, E), fp32 or bf16,
    ordered by decreasing logit (ties to the lower expert id); same math as
    routing.scores_from_logits in fp32."""
    _require_extension()
    return torch.ops.sonicmoe.router_topk(logits, top_k, ROUTER_MODES[routing])


def router_backward(d_score_partial: torch.Tensor, rev_idx: torch.Tensor, scores: torch.Tensor,
                    experts: torch.Tensor, logits: torch.Tensor | None, num_experts: int, routing: str) -> torch.Tensor:
    """R's backward in one kernel: d(loss)/d(logits) (T, E) bf16 from K4's per-slot score
    gradients d_score_partial (rows, slots) fp32, the token's rows rev_idx (T, K) and R's scores
    and experts (T, K); logits (T, E) only for softmax_topk (None otherwise). Same math as
    functional.router_scores_backward in fp32, rounded once."""
    _require_extension()
    return torch.ops.sonicmoe.router_backward(d_score_partial, rev_idx, scores, experts, logits, num_experts,
                                              ROUTER_MODES[routing])


def router_backward_rows(d_score_partial: torch.Tensor, rev_idx: torch.Tensor, scores: torch.Tensor,
                         experts: torch.Tensor, num_experts: int, routing: str) -> tuple[torch.Tensor, torch.Tensor]:
    """router_backward for topk_softmax and softmax_topk_norm, whose d_logits is zero off each
    token's chosen experts: (d_logits (T, E) bf16, d_logit_rows (rows,) fp32), d_logit_rows[r] being
    d_logits[t, e] (before its rounding) at the sorted row r = rev_idx[t, k] of expert e =
    experts[t, k]: grouped_gemm_kn's addend_scale."""
    _require_extension()
    return torch.ops.sonicmoe.router_backward_rows(d_score_partial, rev_idx, scores, experts, num_experts,
                                                   ROUTER_MODES[routing])


def device_routing_metadata(experts: torch.Tensor, num_experts: int):
    """R: routing_metadata (routing.py) computed by three small kernels; same result."""
    _require_extension()
    from .routing import RoutingMetadata

    return RoutingMetadata(*torch.ops.sonicmoe.routing_metadata(experts, num_experts))


def combine(y: torch.Tensor, scores: torch.Tensor, rev_idx: torch.Tensor) -> torch.Tensor:
    """K3: out[t] = sum_k scores[t, k] * y[rev_idx[t, k]], fp32 accumulation, deterministic.

    y: (rows, d) bf16 in the sorted layout; scores: (T, K) (cast to fp32, the router's
    precision); rev_idx: (T, K) int32 from routing_metadata. Returns (T, d) bf16.
    """
    _require_extension()
    return torch.ops.sonicmoe.combine(y, scores.float(), rev_idx)


def combine_dx(dx_rows: torch.Tensor, rev_idx: torch.Tensor, addend: torch.Tensor | None = None) -> torch.Tensor:
    """K8: dx[t] = addend[t] + sum_k dx_rows[rev_idx[t, k]], fp32 sums rounded once to bf16,
    deterministic. addend (optional, (T, d) bf16) is the router's part of dx (d_logits @
    router_weight), so that it needs no pass over dx of its own.

    dx_rows: (rows, d) bf16 in the sorted layout (K6's dX~); rev_idx: (T, K) int32. Returns (T, d) bf16.
    """
    _require_extension()
    return torch.ops.sonicmoe.combine_dx(dx_rows, rev_idx, addend)


def scatter_rows(x: torch.Tensor, rev_idx: torch.Tensor) -> torch.Tensor:
    """out[rev_idx[t, k]] = x[t]: x's rows in the sorted layout (x[gather_idx]), each row of x
    read once. rev_idx: (T, K) int32 from routing_metadata, a permutation of [0, T K), so that
    every row of the (T K, d) bf16 result is written once."""
    _require_extension()
    return torch.ops.sonicmoe.scatter_rows(x, rev_idx)


def autotune_cache_path() -> str:
    """The file where the tile autotuner keeps its choices for the current CUDA device ("" where
    none is written). A grouped-GEMM op called with tile_config "auto" times its candidate tiles
    on the first call of each problem class and keeps the fastest there, keyed by the device's
    name, SM count and driver, by this version, by the timing (its settle) and by the number of
    tile configurations; SONICMOE_AUTOTUNE=0 keeps the shape rules (csrc/sm90/heuristics.h)
    instead, SONICMOE_CACHE_DIR moves the file (empty: memory only).
    The rules and the tuner are described once, in csrc/host/autotune.h."""
    _require_extension()
    return torch.ops.sonicmoe.autotune_cache_path()


def autotune_clear() -> None:
    """Forgets the autotuner's choices held in memory; the next call of each class reads the file
    again (and tunes the classes it lacks)."""
    _require_extension()
    torch.ops.sonicmoe.autotune_clear()


def combine_csr(y, row_scores, rows, token_offsets) -> torch.Tensor:
    """K3 for a variable number of rows per token: out[t] = sum over entries j of token t
    (token_offsets[t] <= j < token_offsets[t+1]) of row_scores[j] * y[rows[j]], fp32, in order."""
    _require_extension()
    return torch.ops.sonicmoe.combine_csr(y, row_scores, rows, token_offsets)


if _C is not None:

    @torch.library.register_fake("sonicmoe::grouped_gemm")
    def _grouped_gemm_fake(a, b, expert_offsets, tile_config=0, partial_rows=False):
        torch._check(a.dim() == 2 and b.dim() == 3, lambda: "grouped_gemm: a must be 2-D, b 3-D")
        torch._check(a.shape[1] == b.shape[2], lambda: "grouped_gemm: a.shape[1] != b.shape[2]")
        return a.new_empty((a.shape[0], b.shape[1]))

    @torch.library.register_fake("sonicmoe::up_proj")
    def _up_proj_fake(x, w1, expert_offsets, gather_idx, keep_h=True, partial_rows=False, tile_config=0,
                      activation=0):
        torch._check(x.dim() == 2 and w1.dim() == 3, lambda: "up_proj: x must be 2-D, w1 3-D")
        torch._check(x.shape[1] == w1.shape[2], lambda: "up_proj: x.shape[1] != w1.shape[2]")
        m, n = gather_idx.shape[0], w1.shape[1] // 2
        return x.new_empty((m if keep_h else 0, 2 * n)), x.new_empty((m, n))

    @torch.library.register_fake("sonicmoe::router_topk")
    def _router_topk_fake(logits, top_k, mode):
        torch._check(logits.dim() == 2, lambda: "router_topk: logits must be 2-D")
        shape = (logits.shape[0], top_k)
        return logits.new_empty(shape, dtype=torch.float32), logits.new_empty(shape, dtype=torch.int32)

    @torch.library.register_fake("sonicmoe::router_backward")
    def _router_backward_fake(d_score_partial, rev_idx, scores, experts, logits, num_experts, mode):
        torch._check(rev_idx.dim() == 2, lambda: "router_backward: rev_idx must be 2-D")
        return rev_idx.new_empty((rev_idx.shape[0], num_experts), dtype=torch.bfloat16)

    @torch.library.register_fake("sonicmoe::router_backward_rows")
    def _router_backward_rows_fake(d_score_partial, rev_idx, scores, experts, num_experts, mode):
        torch._check(rev_idx.dim() == 2, lambda: "router_backward_rows: rev_idx must be 2-D")
        return (rev_idx.new_empty((rev_idx.shape[0], num_experts), dtype=torch.bfloat16),
                d_score_partial.new_empty((d_score_partial.shape[0],)))

    @torch.library.register_fake("sonicmoe::routing_metadata")
    def _routing_metadata_fake(experts, num_experts):
        torch._check(experts.dim() == 2, lambda: "routing_metadata: experts must be 2-D")
        ints = dict(dtype=torch.int32)
        return (experts.new_empty((num_experts + 1,), **ints), experts.new_empty((experts.numel(),), **ints),
                experts.new_empty(experts.shape, **ints))
    @torch.library.register_fake("sonicmoe::grouped_gemm_kn")
    def _grouped_gemm_kn_fake(a, b, expert_offsets, partial_rows=False, tile_config=0, addend_scale=None,
                              addend_rows=None):
        torch._check(a.dim() == 2 and b.dim() == 3, lambda: "grouped_gemm_kn: a must be 2-D, b 3-D")
        torch._check(a.shape[1] == b.shape[1], lambda: "grouped_gemm_kn: a.shape[1] != b.shape[1]")
        torch._check((addend_scale is None) == (addend_rows is None),
                     lambda: "grouped_gemm_kn: addend_scale and addend_rows come both or neither")
        return a.new_empty((a.shape[0], b.shape[2]))

    @torch.library.register_fake("sonicmoe::rounding_probs")
    def _rounding_probs_fake(logits, top_k, write_probs):
        torch._check(logits.dim() == 2, lambda: "rounding_probs: logits must be 2-D")
        T, E = logits.shape
        floats = dict(dtype=torch.float32)
        return (logits.new_empty((T if write_probs else 0, E), **floats), logits.new_empty((E, T), **floats),
                logits.new_empty((E, T), dtype=torch.bool))

    @torch.library.register_fake("sonicmoe::token_rounding_assign")
    def _token_rounding_assign_fake(probs_t, chosen_t, tile, rule):
        return torch.empty_like(chosen_t), probs_t.new_empty((probs_t.shape[0],), dtype=torch.int32)

    @torch.library.register_fake("sonicmoe::dense_layout")
    def _dense_layout_fake(assigned_t, scores_t, row_bound):
        E, T = assigned_t.shape
        ints = dict(dtype=torch.int32, device=assigned_t.device)
        floats = dict(dtype=torch.float32, device=assigned_t.device)
        return (torch.empty(E + 1, **ints), torch.empty(row_bound, **ints), torch.empty(T + 1, **ints),
                torch.empty(row_bound, **ints), torch.empty(row_bound, **floats), torch.empty(row_bound, **floats))

    @torch.library.register_fake("sonicmoe::weight_grad")
    def _weight_grad_fake(a, b, expert_offsets, gather_idx, gather_a, partial_rows=False, tile_config=0,
                          sm_margin=0, rows_past_end_zeroed=False):
        torch._check(a.dim() == 2 and b.dim() == 2, lambda: "weight_grad: a and b must be 2-D")
        return a.new_empty((expert_offsets.shape[0] - 1, a.shape[1], b.shape[1]))

    @torch.library.register_fake("sonicmoe::down_proj_grad")
    def _down_proj_grad_fake(d_out, w2, h, row_score, expert_offsets, gather_idx, partial_rows=False,
                             tile_config=0, activation=0):
        m, n = gather_idx.shape[0], w2.shape[2]
        return (d_out.new_empty((m, 2 * n)), d_out.new_empty((m, n)),
                d_out.new_empty((m, (n + 127) // 128), dtype=torch.float32))

    @torch.library.register_fake("sonicmoe::combine_csr")
    def _combine_csr_fake(y, row_scores, rows, token_offsets):
        return y.new_empty((token_offsets.shape[0] - 1, y.shape[1]))

    @torch.library.register_fake("sonicmoe::combine_dx")
    def _combine_dx_fake(dx_rows, rev_idx, addend=None):
        torch._check(dx_rows.dim() == 2 and rev_idx.dim() == 2, lambda: "combine_dx: dx_rows and rev_idx must be 2-D")
        return dx_rows.new_empty((rev_idx.shape[0], dx_rows.shape[1]))

    @torch.library.register_fake("sonicmoe::scatter_rows")
    def _scatter_rows_fake(x, rev_idx):
        torch._check(x.dim() == 2 and rev_idx.dim() == 2, lambda: "scatter_rows: x and rev_idx must be 2-D")
        return x.new_empty((rev_idx.shape[0] * rev_idx.shape[1], x.shape[1]))

    @torch.library.register_fake("sonicmoe::combine")
    def _combine_fake(y, scores, rev_idx):
        torch._check(y.dim() == 2 and scores.dim() == 2, lambda: "combine: y and scores must be 2-D")
        return y.new_empty((scores.shape[0], y.shape[1]))
