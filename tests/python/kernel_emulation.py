"""An emulation of every sonicmoe op for CPU tensors, to run the Python layer's kernel path on a
machine without a GPU (CI): the autograd Functions of sonicmoe.functional, the metadata they pass
between ops, the dense (token rounding) buffers, the fakes under torch.compile.

Each op first runs the real op's argument checks (its C++ CPU kernel checks every rule an op
checks before a launch, then refuses the device), so an argument the op would refuse on the GPU
fails here too. Then it follows its kernel's contract (csrc/sonicmoe.h, the docstrings of
sonicmoe._ops), not its implementation: the same shapes and dtypes, H in the kernels' column
order, the same fp32 accumulation, and rows the kernel does not write (past expert_offsets[E]
with partial_rows) as NaN, so a consumer that reads them shows it. What it cannot show is a
kernel's own bug: the kernels are tested on the GPU.

    with emulated_kernels():
        out = sonicmoe.moe(x_cpu_bf16, ...)   # runs _MoELayer with these ops
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import is_fake

from sonicmoe import _ops, reference, routing
from sonicmoe.functional import router_scores_backward

_NAN = float("nan")
_ROUTER_MODE_NAMES = {v: k for k, v in _ops.ROUTER_MODES.items()}
_ACTIVATION_NAMES = {v: k for k, v in _ops.GLU_ACTIVATIONS.items()}


def _bounds(expert_offsets, m_total, partial_rows):
    """The experts' row ranges, after the kernels' device-side check of the offsets."""
    off = expert_offsets.tolist()
    ok = off[0] == 0 and all(a <= b for a, b in zip(off, off[1:]))
    ok = ok and (off[-1] <= m_total if partial_rows else off[-1] == m_total)
    if not ok:  # the kernels trap on such offsets
        raise RuntimeError(f"emulated kernel: bad expert_offsets {off} for {m_total} rows")
    return list(zip(off[:-1], off[1:]))


def _rows_by_expert(m_total, cols, expert_offsets, partial_rows, fn, dtype=torch.bfloat16):
    """(m_total, cols) with rows [lo, hi) of expert e = fn(e, lo, hi) (fp32), NaN where unwritten."""
    out = torch.full((m_total, cols), _NAN, dtype=dtype)
    for e, (lo, hi) in enumerate(_bounds(expert_offsets, m_total, partial_rows)):
        if hi > lo:
            out[lo:hi] = fn(e, lo, hi).to(dtype)
    return out


def grouped_gemm(a, b, expert_offsets, tile_config=0, partial_rows=False):
    return _rows_by_expert(a.shape[0], b.shape[1], expert_offsets, partial_rows,
                           lambda e, lo, hi: a[lo:hi].float() @ b[e].float().t())


def grouped_gemm_kn(a, b, expert_offsets, partial_rows=False, tile_config=0, addend_scale=None, addend_rows=None):
    if (addend_scale is None) != (addend_rows is None):
        raise ValueError("grouped_gemm_kn: addend_scale comes with addend_rows: both or neither")

    def rows(e, lo, hi):
        out = a[lo:hi].float() @ b[e].float()
        return out if addend_scale is None else out + addend_scale[lo:hi, None] * addend_rows[e].float()

    return _rows_by_expert(a.shape[0], b.shape[2], expert_offsets, partial_rows, rows)


def up_proj(x, w1, expert_offsets, gather_idx, keep_h=True, partial_rows=False, tile_config=0, activation=0):
    m, n = gather_idx.shape[0], w1.shape[1] // 2
    rows = gather_idx.long()
    h = _rows_by_expert(m, 2 * n, expert_offsets, partial_rows,
                        lambda e, lo, hi: x[rows[lo:hi]].float() @ w1[e].float().t(), dtype=torch.float32)
    a = reference.glu(h, _ACTIVATION_NAMES[activation]).bfloat16()  # from the fp32 accumulators, as K1
    h = _ops.h_column_order(h.bfloat16()) if keep_h else h.new_empty((0, 2 * n), dtype=torch.bfloat16)
    return h, a


def down_proj_grad(d_out, w2, h, row_score, expert_offsets, gather_idx, partial_rows=False, tile_config=0,
                   activation=0):
    m, n = gather_idx.shape[0], w2.shape[2]
    rows = gather_idx.long()
    d_a_prime = _rows_by_expert(m, n, expert_offsets, partial_rows,
                                lambda e, lo, hi: d_out[rows[lo:hi]].float() @ w2[e].float(), dtype=torch.float32)
    hc = _ops.h_column_order(h).float()
    name = _ACTIVATION_NAMES[activation]
    a = reference.glu(hc, name)
    d_h = reference.glu_backward(hc, row_score[:, None] * d_a_prime, name).bfloat16()
    a_scaled = (row_score[:, None] * a).bfloat16()
    slots = (n + 127) // 128
    d_score_partial = F.pad(d_a_prime * a, (0, slots * 128 - n)).view(m, slots, 128).sum(-1)
    if partial_rows:  # past offsets[E]: not written, but for the first 64 rows of d_h and A' (zeros)
        end = int(expert_offsets[-1])
        d_h[end:end + 64] = 0
        a_scaled[end:end + 64] = 0
    return d_h, a_scaled, d_score_partial


_COOPERATIVE_WEIGHT_GRAD = {_ops.GEMM_TILE_CONFIGS[c] for c in ("varlen_cooperative_128x256x64",
                                                                  "varlen_cooperative_256x128x64",
                                                                  "varlen_cooperative_128x256x64_c2x1")}


def weight_grad(a, b, expert_offsets, gather_idx, gather_a, partial_rows=False, tile_config=0, sm_margin=0,
                rows_past_end_zeroed=False):
    rows = gather_idx.long()
    m_total = gather_idx.shape[0]
    # "auto" may take a cooperative tile where the caller says the rows past the end are zeroed.
    if partial_rows and (tile_config in _COOPERATIVE_WEIGHT_GRAD or (tile_config == 0 and rows_past_end_zeroed)):
        # The cooperative tiles read the TMA side's first 64 rows past offsets[E]: the caller's
        # contract is that they are finite (down_proj_grad zeroes them in d_h and A').
        end = int(expert_offsets[-1])
        past = (a if not gather_a else b)[end:end + 64]
        if not torch.isfinite(past).all():
            raise RuntimeError("emulated weight_grad: rows past expert_offsets[E] read by TMA are not finite")
    out = torch.zeros(expert_offsets.shape[0] - 1, a.shape[1], b.shape[1])
    for e, (lo, hi) in enumerate(_bounds(expert_offsets, m_total, partial_rows)):
        a_rows = a[rows[lo:hi]] if gather_a else a[lo:hi]
        b_rows = b[lo:hi] if gather_a else b[rows[lo:hi]]
        out[e] = a_rows.float().t() @ b_rows.float()
    return out.bfloat16()


def router_topk(logits, top_k, mode):
    scores, experts = routing.scores_from_logits(logits.float(), top_k, _ROUTER_MODE_NAMES[mode])
    return scores.float(), experts.int()


def rounding_probs(logits, top_k, write_probs):
    probs = logits.float().softmax(dim=-1)
    T, E = probs.shape
    chosen = torch.zeros(T, E, dtype=torch.bool).scatter_(1, probs.topk(top_k, dim=-1).indices, True)
    return (probs if write_probs else probs.new_empty((0, E))), probs.t().contiguous(), chosen.t().contiguous()


def router_backward(d_score_partial, rev_idx, scores, experts, logits, num_experts, mode):
    d_scores = d_score_partial.sum(dim=1)[rev_idx.long()]
    return router_scores_backward(logits, scores, experts, d_scores, _ROUTER_MODE_NAMES[mode],
                                  num_experts=num_experts).bfloat16()


def router_backward_rows(d_score_partial, rev_idx, scores, experts, num_experts, mode):
    if _ROUTER_MODE_NAMES[mode] == "softmax_topk":
        raise ValueError("router_backward_rows: mode 1 (softmax_topk) has d_logits at every expert")
    d_scores = d_score_partial.sum(dim=1)[rev_idx.long()]
    d_logits = router_scores_backward(None, scores, experts, d_scores, _ROUTER_MODE_NAMES[mode],
                                      num_experts=num_experts)
    d_logit_rows = torch.full((d_score_partial.shape[0],), _NAN)
    d_logit_rows[rev_idx.reshape(-1).long()] = d_logits.gather(1, experts.long()).reshape(-1)
    return d_logits.bfloat16(), d_logit_rows


def routing_metadata(experts, num_experts):
    return tuple(routing.routing_metadata(experts, num_experts))


def token_rounding_assign(probs_t, chosen_t, tile, rule):
    T = probs_t.shape[1]
    counts = chosen_t.sum(dim=1)
    target = routing._rounded_counts(counts, T, tile, routing.TOKEN_ROUNDING_RULES[rule])
    assigned = routing._assign_by_sort(probs_t.t(), chosen_t.t(), target)
    return assigned.t().contiguous(), assigned.sum(dim=0, dtype=torch.int32)


def dense_layout(assigned_t, scores_t, row_bound):
    return tuple(routing.dense_routing_metadata_by_torch(scores_t, assigned_t, row_bound))


def combine(y, scores, rev_idx):
    return (scores.float().unsqueeze(-1) * y[rev_idx.long()].float()).sum(dim=1).bfloat16()


def combine_dx(dx_rows, rev_idx, addend=None):
    dx = dx_rows[rev_idx.long()].float().sum(dim=1)
    return (dx if addend is None else dx + addend.float()).bfloat16()


def scatter_rows(x, rev_idx):
    out = torch.full((rev_idx.numel(), x.shape[1]), _NAN, dtype=x.dtype)  # a row not written shows
    out[rev_idx.long().reshape(-1)] = x.repeat_interleave(rev_idx.shape[1], dim=0)
    return out


def combine_csr(y, row_scores, rows, token_offsets):
    T = token_offsets.shape[0] - 1
    counts = (token_offsets[1:] - token_offsets[:-1]).long()
    entries = int(token_offsets[-1])
    token = torch.repeat_interleave(torch.arange(T), counts)
    terms = row_scores[:entries, None].float() * y[rows[:entries].long()].float()
    return torch.zeros(T, y.shape[1]).index_add_(0, token, terms).bfloat16()


OPS = {f.__name__: f for f in (grouped_gemm, grouped_gemm_kn, up_proj, down_proj_grad, weight_grad, router_topk,
                                rounding_probs, routing_metadata, token_rounding_assign, dense_layout, combine,
                                combine_csr, combine_dx, router_backward, router_backward_rows, scatter_rows)}


def _checked(name, emulate):
    """The op's own host rules, then its emulation: the real op's CPU kernel (csrc/torch) runs
    every argument check an op makes before a launch and then refuses the device, so an argument
    the real op would refuse fails here as it would on the GPU. Fake and functional tensors
    (torch.compile's tracing) go on below autograd, to the ops' fakes."""
    op = getattr(torch.ops.sonicmoe, name).default

    def run(*args, **kwargs):
        traced = any(isinstance(a, torch.Tensor) and is_fake(a) for a in (*args, *kwargs.values()))
        with torch._C._AutoDispatchBelowAutograd():
            if traced:
                return op(*args, **kwargs)
            try:
                op(*args, **kwargs)
            except Exception as e:  # noqa: BLE001: the rules raise ValueError, TypeError or RuntimeError
                if "must be a CUDA device" not in str(e):
                    raise
            else:
                raise AssertionError(f"{name}'s CPU kernel returned: it should refuse CPU tensors")
        return emulate(*args, **kwargs)

    return run


@contextlib.contextmanager
def emulated_kernels():
    """CPU tensors take the kernel path, with the ops above for CPU after each op's own argument
    checks (_checked); restores both on exit. The emulation sits on the AutogradCPU key, above
    the ops' C++ CPU kernels, which it calls for their checks."""
    if not _ops.extension_available():
        raise RuntimeError("emulated_kernels needs sonicmoe._C built: the ops' schemas and fakes live there")
    lib = torch.library.Library("sonicmoe", "IMPL")
    try:
        for name, fn in OPS.items():
            lib.impl(name, _checked(name, fn), "AutogradCPU")
        _ops.KERNEL_DEVICE_TYPES.add("cpu")
        yield
    finally:
        _ops.KERNEL_DEVICE_TYPES.discard("cpu")
        lib._destroy()
