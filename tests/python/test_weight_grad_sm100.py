"""torch.ops.sonicmoe.weight_grad (K5, K7) on a Blackwell sm_100 GPU (B200, GB200) against fp32, with
the Hopper test's checks and tolerances (tests/python/test_weight_grad.py: relative Frobenius 1e-2,
finite, idle experts exactly zero): the sm100 kernel (the 128-wide gathered side by cp.async, the
256-wide dense side by TMA or, for rows past offsets[E] that may be unwritten and for no rows, by
cp.async too; 1-SM tcgen05 MMA on 128 x 256 x 64 tiles; K7 as the transposed problem), tile_config
"auto" only. Skips elsewhere."""

import re

import pytest
import torch

import sonicmoe
from conftest import requires_blackwell
from test_grouped_gemm import generator, offsets_from_counts, random_counts
from test_weight_grad import check_weight_grad_out, want_weight_grad

pytestmark = [requires_blackwell, pytest.mark.usefixtures("fp32_matmul_reference")]


def inputs(T, m_total, m_out, n_out, counts, gather_a, gen):
    offsets = offsets_from_counts(counts)
    gather_idx = torch.randint(0, max(T, 1), (m_total,), device="cuda", generator=gen, dtype=torch.int32)
    a = torch.randn(T if gather_a else m_total, m_out, device="cuda", generator=gen).bfloat16()
    b = torch.randn(m_total if gather_a else T, n_out, device="cuda", generator=gen).bfloat16()
    return a, b, offsets, gather_idx


# The Hopper shapes: outputs not multiples of the 128 x 256 tile on either side (K7's transposed
# store past its m_out and n_out), every row in one expert, a tiny problem, no rows at all, one
# expert with a partial last k step, partial 256-wide blocks; and many k steps per tile (both TMEM
# accumulators in turn, the 4-stage ring wrapping).
@pytest.mark.parametrize("gather_a", [True, False])
@pytest.mark.parametrize("T,K,m_out,n_out,E,layout", [
    (700, 8, 1536, 256, 128, "ragged"),
    (300, 2, 136, 200, 8, "ragged"),
    (1000, 4, 512, 1024, 16, "one hot"),
    (50, 1, 64, 64, 4, "ragged"),
    (0, 2, 128, 128, 8, "ragged"),
    (257, 1, 256, 128, 1, "ragged"),
    (600, 4, 392, 520, 6, "ragged"),
    (4096, 2, 256, 512, 4, "ragged"),
])
def test_weight_grad_matches_fp32(gather_a, T, K, m_out, n_out, E, layout):
    gen = generator("wgrad-sm100", gather_a, T, K, m_out, n_out, E, layout)
    m_total = T * K
    counts = random_counts(m_total, E, gen) if layout == "ragged" else [0] * (E - 1) + [m_total]
    a, b, offsets, gather_idx = inputs(T, m_total, m_out, n_out, counts, gather_a, gen)
    out = sonicmoe.weight_grad(a, b, offsets, gather_idx, gather_a)
    check_weight_grad_out(out, want_weight_grad(a, b, offsets, gather_idx, gather_a), counts, m_out, n_out)


# An idle expert's output memory may hold anything before the kernel: every element is written.
@pytest.mark.parametrize("gather_a", [True, False])
def test_idle_experts_get_exact_zeros_on_recycled_memory(gather_a):
    gen = generator("wgrad-sm100-idle", gather_a)
    T, m_out, n_out, E = 300, 392, 520, 6
    counts = [0, 250, 0, 0, 350, 0]
    a, b, offsets, gather_idx = inputs(T, 600, m_out, n_out, counts, gather_a, gen)
    poison = torch.full((E * m_out * n_out,), float("nan"), device="cuda", dtype=torch.bfloat16)
    del poison  # the caching allocator hands this memory to the output
    out = sonicmoe.weight_grad(a, b, offsets, gather_idx, gather_a)
    check_weight_grad_out(out, want_weight_grad(a, b, offsets, gather_idx, gather_a), counts, m_out, n_out)


# Token rounding's buffers: offsets[E] < m_total. Rows past it unwritten (NaN): the dense side by
# cp.async, which stops at each expert's end. rows_past_end_zeroed (the layer: down_proj_grad zeroes
# 64 rows there): the dense side by TMA boxes, which read those zeros and meet zero-filled gathered
# rows; NaN beyond them is never read. Both match the rows that exist.
@pytest.mark.parametrize("zeroed", [False, True])
@pytest.mark.parametrize("gather_a", [True, False])
def test_partial_rows(gather_a, zeroed):
    gen = generator("wgrad-sm100-partial", gather_a, zeroed)
    T, m_total, rows, m_out, n_out, E = 400, 1200, 701, 256, 384, 8
    counts = random_counts(rows, E, gen)
    a, b, offsets, gather_idx = inputs(T, m_total, m_out, n_out, counts, gather_a, gen)
    dense = b if gather_a else a
    if zeroed:
        dense[rows:rows + 64] = 0
        dense[rows + 64:] = float("nan")
    else:
        dense[rows:] = float("nan")
    out = sonicmoe.weight_grad(a, b, offsets, gather_idx, gather_a, partial_rows=True, rows_past_end_zeroed=zeroed)
    a_rows, b_rows = (a, b[:rows]) if gather_a else (a[:rows], b)
    want = want_weight_grad(a_rows, b_rows, offsets, gather_idx[:rows], gather_a)
    check_weight_grad_out(out, want, counts, m_out, n_out)


def test_no_rows_with_partial_rows_gives_zeros():
    gen = generator("wgrad-sm100-empty")
    a, b, offsets, gather_idx = inputs(10, 0, 128, 64, [0, 0, 0], True, gen)
    out = sonicmoe.weight_grad(a, b, offsets, gather_idx, True, partial_rows=True)
    assert out.shape == (3, 128, 64) and not out.any()


# The two dense paths give the same sums in the same order: bit-identical.
@pytest.mark.parametrize("gather_a", [True, False])
def test_tma_and_cp_async_dense_sides_agree(gather_a):
    gen = generator("wgrad-sm100-paths", gather_a)
    T, m_out, n_out, E = 500, 264, 328, 5
    counts = random_counts(1500, E, gen)
    a, b, offsets, gather_idx = inputs(T, 1500, m_out, n_out, counts, gather_a, gen)
    by_tma = sonicmoe.weight_grad(a, b, offsets, gather_idx, gather_a)
    by_cp_async = sonicmoe.weight_grad(a, b, offsets, gather_idx, gather_a, partial_rows=True)
    assert torch.equal(by_tma, by_cp_async)


@pytest.mark.parametrize("gather_a", [True, False])
def test_sm_margin_gives_the_same_bits(gather_a):
    gen = generator("wgrad-sm100-margin", gather_a)
    T, K, m_out, n_out, E = 1500, 4, 392, 520, 6
    counts = random_counts(T * K, E, gen)
    a, b, offsets, gather_idx = inputs(T, T * K, m_out, n_out, counts, gather_a, gen)
    full = sonicmoe.weight_grad(a, b, offsets, gather_idx, gather_a)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for margin in (4, 9, sms - 1):
        assert torch.equal(sonicmoe.weight_grad(a, b, offsets, gather_idx, gather_a, sm_margin=margin), full), margin


def test_explicit_tile_config_is_refused_naming_the_rule():
    gen = generator("wgrad-sm100-explicit")
    a, b, offsets, gather_idx = inputs(40, 100, 64, 128, [30, 0, 70], True, gen)
    with pytest.raises(ValueError, match=re.escape("weight_grad: config = 8 breaks the rule: must be 0 (auto) on an "
                                                   "sm_100 GPU")):
        sonicmoe.weight_grad(a, b, offsets, gather_idx, True, tile_config="varlen_cooperative_128x256x64")


def test_weight_grad_opcheck():
    gen = generator("wgrad-sm100-opcheck")
    a, b, offsets, gather_idx = inputs(40, 100, 64, 128, [30, 0, 70], True, gen)
    torch.library.opcheck(torch.ops.sonicmoe.weight_grad, (a, b, offsets, gather_idx, True, False))
