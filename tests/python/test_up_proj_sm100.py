"""torch.ops.sonicmoe.up_proj (K1) on a Blackwell sm_100 GPU (B200, GB200) against fp32, with the
Hopper test's checks and tolerances (tests/python/test_up_proj.py: relative Frobenius 1e-2 for A
and for H in its public column order, no NaN/Inf, NaN-filled memory behind the outputs so an
unwritten row shows): the sm100 kernel (x rows gathered by cp.async, w1 by TMA, 1-SM tcgen05 MMA
on 128 x 256 tiles, the gated activation from TMEM), tile_config "auto" only. Skips elsewhere."""

import re

import pytest
import torch

import sonicmoe
from conftest import ANCHOR_CONFIGS, requires_blackwell
from test_grouped_gemm import generator, random_counts
from test_up_proj import check, make_inputs, reference, rel_err
# The Hopper tests that take tile_config "auto" run here as they are (pytestmark above applies).
from test_up_proj import (test_cuda_graph_capture_with_new_routing, test_device_errors_on_gpu,  # noqa: F401
                          test_empty_input_returns_empty, test_gated_activations_auto_and_without_h, test_opcheck,
                          test_without_h)

pytestmark = [requires_blackwell, pytest.mark.usefixtures("fp32_matmul_reference")]

ANCHOR_SHAPES = {name: (c["d"], c["n"], c["E"]) for name, c in ANCHOR_CONFIGS.items()}
ACTIVATIONS = pytest.mark.parametrize("activation", ["swiglu", "geglu", "reglu"])


@pytest.mark.parametrize("name", list(ANCHOR_SHAPES))
def test_anchor_up_projection_shapes(name):
    d, n, E = ANCHOR_SHAPES[name]
    gen = generator("up-sm100", name)
    check(*make_inputs(random_counts(2000, E, gen), 700, d, n, gen))


@pytest.mark.parametrize("E", [1, 8, 128, 256])
def test_expert_counts_with_empty_experts(E):
    gen = generator("up-sm100-E", E)
    check(*make_inputs(random_counts(3000 + 37, E, gen), 1000, 256, 192, gen))


def test_one_expert_holds_all_rows():
    gen = generator("up-sm100-hot")
    check(*make_inputs([0, 0, 0, 1111, 0, 0, 0, 0], 300, 512, 128, gen))


@pytest.mark.parametrize("m_total", [1, 7, 129, 1000, 4095])
def test_m_total_not_a_multiple_of_the_tile(m_total):
    # Rows past an expert's end in a tile: zero-filled in shared memory, never stored.
    gen = generator("up-sm100-m", m_total)
    check(*make_inputs(random_counts(m_total, 8, gen), 64, 128, 64, gen))


def test_many_tiles_per_cta_and_deep_k():
    # More tiles than SMs (both TMEM accumulators in turn), k loops longer than the 4-stage ring.
    gen = generator("up-sm100-deep")
    check(*make_inputs(random_counts(64 * 300, 64, gen), 2000, 1024, 256, gen))


@pytest.mark.parametrize("d,n", [(8, 8), (72, 40), (200, 1000), (1000, 200), (4096, 64), (256, 48)])
def test_d_and_n_not_multiples_of_the_tile(d, n):
    # A partial last k step (zero-filled past d), partial n blocks, H's trailing partial 32-column
    # block (n % 32 != 0: stored in column order).
    gen = generator("up-sm100-dn", d, n)
    check(*make_inputs(random_counts(600, 4, gen), 333, d, n, gen))


@ACTIVATIONS
@pytest.mark.parametrize("m_total,E,T,d,n", [(600, 4, 333, 72, 40), (64 * 300, 64, 2000, 1024, 256),
                                             (1500, 16, 400, 4096, 128), (3037, 128, 1000, 256, 192)])
def test_gated_activations(m_total, E, T, d, n, activation):
    gen = generator("up-sm100-act", m_total, E, d, n, activation)
    check(*make_inputs(random_counts(m_total, E, gen), T, d, n, gen), activation=activation)


def test_partial_rows():
    # Token rounding's upper-bound buffers: expert_offsets[E] = 900 < m_total = 1000; the rows up to
    # offsets[E] are computed as usual (the scheduler walks only those).
    gen = generator("up-sm100-partial")
    x, w1, offs, gather_idx = make_inputs(random_counts(900, 8, gen), 300, 256, 128, gen)
    padded = torch.cat([gather_idx, torch.zeros(100, device="cuda", dtype=torch.int32)])
    h, a = sonicmoe.up_proj(x, w1, offs, padded, partial_rows=True)
    torch.cuda.synchronize()
    h_ref, a_ref = reference(x, w1, offs, gather_idx)
    assert h.shape == (1000, 256) and a.shape == (1000, 128)
    assert torch.isfinite(a[:900]).all() and torch.isfinite(h[:900]).all()
    assert rel_err(a[:900], a_ref) <= 1e-2
    assert rel_err(sonicmoe.h_column_order(h[:900]), h_ref) <= 1e-2


def test_explicit_tile_config_is_refused_naming_the_rule():
    gen = generator("up-sm100-explicit")
    args = make_inputs([64, 64], 128, 64, 64, gen)
    with pytest.raises(ValueError, match=re.escape("up_proj: config = 7 breaks the rule: must be 0 (auto) on an "
                                                   "sm_100 GPU")):
        sonicmoe.up_proj(*args, tile_config="varlen_pingpong_128x128x64")
