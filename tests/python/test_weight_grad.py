"""K5 / K7 (weight_grad, varlen-K with the gather in the loads) against fp32 torch on the GPU, and
its argument rules on the CPU."""

import re

import pytest
import torch

import sonicmoe
from conftest import requires_extension, requires_hopper
from test_grouped_gemm import generator, offsets_from_counts, random_counts


def rel(a, b):
    return ((a.float() - b).norm() / b.norm().clamp_min(1e-30)).item()


def want_weight_grad(a, b, offsets, gather_idx, gather_a):
    """out[e] = a_rows[e]^T b_rows[e] in fp32, the gathered side's rows taken by gather_idx."""
    rows_a = a.float()[gather_idx.long()] if gather_a else a.float()
    rows_b = b.float() if gather_a else b.float()[gather_idx.long()]
    bounds = offsets.tolist()
    out = torch.zeros(len(bounds) - 1, a.shape[1], b.shape[1], device=a.device)
    for e in range(len(bounds) - 1):
        out[e] = rows_a[bounds[e]:bounds[e + 1]].T @ rows_b[bounds[e]:bounds[e + 1]]
    return out


def check_weight_grad_out(out, want, counts, m_out, n_out):
    """out: bf16 (E, m_out, n_out), finite, exact zeros for the experts without rows (counts),
    within 1e-2 relative Frobenius of the fp32 want."""
    assert out.shape == (len(counts), m_out, n_out) and out.dtype == torch.bfloat16
    assert torch.isfinite(out).all()
    idle = torch.tensor(counts, device="cuda") == 0
    assert not out[idle].any(), "an expert without rows must get exact zeros"
    if want.any():
        assert rel(out, want) <= 1e-2


# "auto": the cooperative tile whose gathered side is 128 wide (128 x 256 gathering A, 256 x 128
# gathering B), ping-pong without rows; both spelled out too, and the cooperative tile in 2 x 1
# clusters (auto's where experts average 2048 rows; partial 256-wide blocks and odd m block
# counts here: a pair's second tile past m_out).
@requires_hopper
@pytest.mark.usefixtures("fp32_matmul_reference")
@pytest.mark.parametrize("tile", ["auto", "pingpong", "cooperative", "cooperative_c2x1"])
@pytest.mark.parametrize("gather_a", [True, False])
@pytest.mark.parametrize("T,K,m_out,n_out,E,layout", [
    (700, 8, 1536, 256, 128, "ragged"),   # dW2 / dW1 shapes of paper-7b at small T
    (300, 2, 136, 200, 8, "ragged"),      # outputs not multiples of the 128 tile
    (1000, 4, 512, 1024, 16, "one hot"),  # every row in one expert, the others empty
    (50, 1, 64, 64, 4, "ragged"),
    (0, 2, 128, 128, 8, "ragged"),        # no rows: every gradient exactly zero
    (257, 1, 256, 128, 1, "ragged"),      # one expert, a partial last k step
    (600, 4, 392, 520, 6, "ragged"),      # partial 256-wide blocks on either side
])
def test_weight_grad_matches_fp32(tile, gather_a, T, K, m_out, n_out, E, layout):
    gen = generator("wgrad", gather_a, T, K, m_out, n_out, E, layout)
    m_total = T * K
    counts = random_counts(m_total, E, gen) if layout == "ragged" else [0] * (E - 1) + [m_total]
    offsets = offsets_from_counts(counts)
    gather_idx = torch.randint(0, max(T, 1), (m_total,), device="cuda", generator=gen, dtype=torch.int32)
    a = torch.randn(T if gather_a else m_total, m_out, device="cuda", generator=gen).bfloat16()
    b = torch.randn(m_total if gather_a else T, n_out, device="cuda", generator=gen).bfloat16()
    tile_config = {"auto": "auto", "pingpong": "varlen_pingpong_128x128x64",
                   "cooperative": "varlen_cooperative_128x256x64" if gather_a else "varlen_cooperative_256x128x64",
                   "cooperative_c2x1": "varlen_cooperative_128x256x64_c2x1"}[tile]
    out = sonicmoe.weight_grad(a, b, offsets, gather_idx, gather_a, tile_config=tile_config)
    check_weight_grad_out(out, want_weight_grad(a, b, offsets, gather_idx, gather_a), counts, m_out, n_out)


@requires_hopper
@pytest.mark.usefixtures("fp32_matmul_reference")
def test_weight_grad_partial_rows_ignores_rows_past_the_last_offset():
    # Token rounding's buffers: offsets[E] < m_total, and the rows past it hold garbage (NaN).
    gen = generator("wgrad-partial")
    T, m_total, m_out, n_out, E = 400, 900, 256, 128, 8
    counts = random_counts(700, E, gen)
    offsets = offsets_from_counts(counts)
    gather_idx = torch.randint(0, T, (m_total,), device="cuda", generator=gen, dtype=torch.int32)
    a = torch.randn(T, m_out, device="cuda", generator=gen).bfloat16()
    b = torch.randn(m_total, n_out, device="cuda", generator=gen).bfloat16()
    b[700:] = float("nan")
    out = sonicmoe.weight_grad(a, b, offsets, gather_idx, True, partial_rows=True)
    want = want_weight_grad(a, b[:700], offsets, gather_idx[:700], True)
    assert torch.isfinite(out).all() and rel(out, want) <= 1e-2


@requires_hopper
@pytest.mark.usefixtures("fp32_matmul_reference")
@pytest.mark.parametrize("clustered", [False, True])
@pytest.mark.parametrize("gather_a", [True, False])
def test_weight_grad_cooperative_partial_rows_with_the_rows_past_the_end_zeroed(gather_a, clustered):
    # The cooperative tiles read the dense operand by 64-row TMA boxes, past offsets[E] too:
    # with kRowsZeroedPastEnd zero rows there (down_proj_grad's outputs) and NaN beyond, the
    # result matches the rows that exist, and the ping-pong partial_rows path.
    gen = generator("wgrad-co-partial", gather_a, clustered)
    T, m_total, rows, m_out, n_out, E = 400, 1200, 701, 256, 128, 8
    offsets = offsets_from_counts(random_counts(rows, E, gen))
    gather_idx = torch.randint(0, T, (m_total,), device="cuda", generator=gen, dtype=torch.int32)
    gathered = torch.randn(T, m_out if gather_a else n_out, device="cuda", generator=gen).bfloat16()
    dense = torch.randn(m_total, n_out if gather_a else m_out, device="cuda", generator=gen).bfloat16()
    dense[rows:rows + 64] = 0
    dense[rows + 64:] = float("nan")
    a, b = (gathered, dense) if gather_a else (dense, gathered)
    tile = "varlen_cooperative_128x256x64" if gather_a else "varlen_cooperative_256x128x64"
    tile = "varlen_cooperative_128x256x64_c2x1" if clustered else tile
    out = sonicmoe.weight_grad(a, b, offsets, gather_idx, gather_a, partial_rows=True, tile_config=tile)
    pingpong = sonicmoe.weight_grad(a, b, offsets, gather_idx, gather_a, partial_rows=True)
    a_rows, b_rows = (a, b[:rows]) if gather_a else (a[:rows], b)
    want = want_weight_grad(a_rows, b_rows, offsets, gather_idx[:rows], gather_a)
    assert torch.isfinite(out).all() and rel(out, want) <= 1e-2
    assert rel(out, pingpong.float()) <= 1e-2
    if not clustered:  # auto, told the rows past the end are zeroed, takes the cooperative tile here
        chosen = sonicmoe.weight_grad(a, b, offsets, gather_idx, gather_a, partial_rows=True, rows_past_end_zeroed=True)
        assert torch.equal(chosen, out)


@requires_hopper
def test_down_proj_grad_zeroes_the_rows_past_the_end_with_partial_rows():
    # d_h and A' get zeros on their first 64 rows past offsets[E] (what the weight gradients'
    # TMA boxes may read); the outputs likely take the freed NaN block below (caching allocator).
    gen = generator("k4-tail")
    T, d, n, E, rows, bound = 300, 256, 128, 4, 517, 800
    offsets = offsets_from_counts(random_counts(rows, E, gen))
    gather_idx = torch.randint(0, T, (bound,), device="cuda", generator=gen, dtype=torch.int32)
    d_out = torch.randn(T, d, device="cuda", generator=gen).bfloat16()
    w2 = (torch.randn(E, d, n, device="cuda", generator=gen) * n**-0.5).bfloat16()
    h = torch.randn(bound, 2 * n, device="cuda", generator=gen).bfloat16()
    row_score = torch.rand(bound, device="cuda", generator=gen)
    poison = torch.full((bound * 3 * n * 4,), float("nan"), device="cuda", dtype=torch.bfloat16)
    del poison  # the caching allocator hands this memory to the outputs below
    d_h, a_scaled, _ = sonicmoe.down_proj_grad(d_out, w2, h, row_score, offsets, gather_idx, partial_rows=True)
    assert not d_h[rows:rows + 64].any() and not a_scaled[rows:rows + 64].any()
    assert torch.isfinite(d_h[:rows]).all() and torch.isfinite(a_scaled[:rows]).all()


# sm_margin leaves SMs to other streams (the layer's tail beside K5 / K7): fewer CTAs walk the same
# tiles, each tile's k loop unchanged, so the gradients are bit-identical; the margin's bound is
# the device's SM count.
@requires_hopper
@pytest.mark.parametrize("tile", ["pingpong", "cooperative", "cooperative_c2x1"])
@pytest.mark.parametrize("gather_a", [True, False])
def test_weight_grad_sm_margin_gives_the_same_bits(tile, gather_a):
    gen = generator("wgrad-margin", tile, gather_a)
    T, K, m_out, n_out, E = 1500, 4, 392, 520, 6
    offsets = offsets_from_counts(random_counts(T * K, E, gen))
    gather_idx = torch.randint(0, T, (T * K,), device="cuda", generator=gen, dtype=torch.int32)
    a = torch.randn(T if gather_a else T * K, m_out, device="cuda", generator=gen).bfloat16()
    b = torch.randn(T * K if gather_a else T, n_out, device="cuda", generator=gen).bfloat16()
    tile_config = {"pingpong": "varlen_pingpong_128x128x64",
                   "cooperative": "varlen_cooperative_128x256x64" if gather_a else "varlen_cooperative_256x128x64",
                   "cooperative_c2x1": "varlen_cooperative_128x256x64_c2x1"}[tile]
    full = sonicmoe.weight_grad(a, b, offsets, gather_idx, gather_a, tile_config=tile_config)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for margin in (4, 9, sms - 1):
        assert torch.equal(sonicmoe.weight_grad(a, b, offsets, gather_idx, gather_a, tile_config=tile_config,
                                                sm_margin=margin), full), margin
    with pytest.raises(ValueError, match=re.escape(
            f"weight_grad: sm_margin = {sms} breaks the rule: must be below the device's {sms} SMs")):
        sonicmoe.weight_grad(a, b, offsets, gather_idx, gather_a, tile_config=tile_config, sm_margin=sms)


@requires_hopper
def test_weight_grad_opcheck():
    gen = generator("wgrad-opcheck")
    offsets = offsets_from_counts([30, 0, 70])
    gather_idx = torch.randint(0, 40, (100,), device="cuda", generator=gen, dtype=torch.int32)
    a = torch.randn(40, 64, device="cuda", generator=gen).bfloat16()
    b = torch.randn(100, 128, device="cuda", generator=gen).bfloat16()
    torch.library.opcheck(torch.ops.sonicmoe.weight_grad, (a, b, offsets, gather_idx, True, False))


def _cpu_args(**change):
    args = dict(a=torch.zeros(10, 64, dtype=torch.bfloat16), b=torch.zeros(20, 32, dtype=torch.bfloat16),
                expert_offsets=torch.tensor([0, 5, 20], dtype=torch.int32),
                gather_idx=torch.zeros(20, dtype=torch.int32), gather_a=True, partial_rows=False, tile_config=0,
                sm_margin=0)
    args.update(change)
    return args


@requires_extension
@pytest.mark.parametrize("change,error,message", [
    (dict(a=torch.zeros(10, 64)), TypeError, "weight_grad: a.dtype = Float breaks the rule: must be BFloat16"),
    (dict(gather_idx=torch.zeros(20, dtype=torch.int64)), TypeError,
     "weight_grad: gather_idx.dtype = Long breaks the rule: must be Int"),
    (dict(b=torch.zeros(19, 32, dtype=torch.bfloat16)), ValueError,
     "weight_grad: b.shape = [19, 32] breaks the rule: shape[0] must equal gather_idx.shape[0] = 20"),
    (dict(a=torch.zeros(10, 60, dtype=torch.bfloat16)), ValueError,
     "weight_grad: m_out = 60 breaks the rule: must be a positive multiple of 8"),
    (dict(expert_offsets=torch.tensor([0], dtype=torch.int32)), ValueError,
     "weight_grad: expert_offsets.shape = [1] breaks the rule: needs at least one expert"),
    (dict(a=torch.zeros(64, 10, dtype=torch.bfloat16).t()), ValueError,
     "weight_grad: a.stride() = [1, 10] breaks the rule: must be contiguous"),
    (dict(tile_config=3), ValueError, "weight_grad: config = 3 breaks the rule: must be 0 (auto), 7"),
    (dict(tile_config=9), ValueError, "weight_grad: config = 9 breaks the rule: must not be 9 with gather_a"),
    (dict(tile_config=8, gather_a=False, a=torch.zeros(20, 64, dtype=torch.bfloat16),
          b=torch.zeros(10, 32, dtype=torch.bfloat16)), ValueError,
     "weight_grad: config = 8 breaks the rule: must not be 8 without gather_a"),
    (dict(sm_margin=-1), ValueError, "weight_grad: sm_margin = -1 breaks the rule: must be >= 0"),
    (dict(), ValueError, "weight_grad: a.device = cpu breaks the rule: must be a CUDA device"),
])
def test_weight_grad_rejects_bad_arguments(change, error, message):
    with pytest.raises(error, match=re.escape(message)):
        torch.ops.sonicmoe.weight_grad(*_cpu_args(**change).values())


def test_layer_weight_gradients_take_the_copy_of_x_only_where_it_measured_faster():
    # Eager dW1 over a copy of x + torch._grouped_mm only at 1024 < n < 2048 (qwen3-235b-a22b's
    # n 1536); dW2 always on K5 (docs/performance.md).
    on_k7 = sonicmoe.functional._dw1_on_k7
    assert on_k7(256) and on_k7(1024) and on_k7(2048) and on_k7(4096)
    assert not on_k7(1536)
