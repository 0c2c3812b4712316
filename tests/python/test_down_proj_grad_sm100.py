"""torch.ops.sonicmoe.down_proj_grad (K4) on a Blackwell sm_100 GPU (B200, GB200) against fp32, with
the Hopper test's checks and tolerances (tests/python/test_backward_kernels.py, check_down_proj_grad:
relative Frobenius 1e-2 for dH, A' and the score-gradient partials, every slot written): the sm100
kernel (dO rows gathered by cp.async, w2 by TMA read N-major, 1-SM tcgen05 MMA on 128 x 256 tiles,
the dGLU epilogue from TMEM), tile_config "auto" only. H comes from up_proj (the sm100 K1 there).
Skips elsewhere."""

import re

import pytest
import torch

import sonicmoe
from conftest import requires_blackwell
from test_backward_kernels import check_down_proj_grad
from test_grouped_gemm import generator

pytestmark = [requires_blackwell, pytest.mark.usefixtures("fp32_matmul_reference")]

ACTIVATIONS = pytest.mark.parametrize("activation", ["swiglu", "geglu", "reglu"])


# The Hopper shapes: 128 experts of few rows; n 200 (a partial 256-column tile, a trailing partial
# 32-column block of H, the second score slot partial); n 384 (a 256-column tile's second slot past
# n); a tiny problem; 8192 x 1024 (many tiles per CTA: both TMEM accumulators in turn, d deeper
# than the 4-stage ring on the others).
@pytest.mark.parametrize("T,d,n,E,K", [(700, 1536, 256, 128, 8), (300, 256, 200, 8, 2), (300, 256, 384, 8, 2),
                                       (50, 64, 64, 4, 1), (8192, 256, 1024, 4, 2), (200, 4096, 256, 8, 2)])
def test_down_proj_grad_matches_the_reference_spec(T, d, n, E, K):
    check_down_proj_grad(T, d, n, E, K, "auto")


@pytest.mark.parametrize("T,d,n,E,K", [(200, 72, 40, 4, 2), (300, 1000, 136, 8, 2), (100, 8, 8, 2, 1)])
def test_d_and_n_not_multiples_of_the_tile(T, d, n, E, K):
    # A partial last k step (zero-filled past d), n below one 32-column block of H, one chunk past
    # a whole 128-column slot.
    check_down_proj_grad(T, d, n, E, K, "auto")


@pytest.mark.parametrize("T,d,n,E,K,tail_rows", [(300, 256, 256, 8, 2, 77), (200, 4096, 512, 8, 2, 200)])
def test_partial_rows(T, d, n, E, K, tail_rows):
    check_down_proj_grad(T, d, n, E, K, "auto", tail_rows)


@ACTIVATIONS
@pytest.mark.parametrize("T,d,n,E,K,tail_rows", [(300, 256, 200, 8, 2, 0), (8192, 256, 1024, 4, 2, 0),
                                                 (300, 256, 256, 8, 2, 77)])
def test_gated_activations(T, d, n, E, K, tail_rows, activation):
    check_down_proj_grad(T, d, n, E, K, "auto", tail_rows, activation)


def test_explicit_tile_config_is_refused_naming_the_rule():
    gen = generator("k4-sm100-explicit")
    d, n, E = 64, 64, 2
    d_out = torch.randn(16, d, device="cuda", generator=gen).bfloat16()
    w2 = torch.randn(E, d, n, device="cuda", generator=gen).bfloat16()
    h = torch.randn(32, 2 * n, device="cuda", generator=gen).bfloat16()
    row_score = torch.rand(32, device="cuda", generator=gen)
    offs = torch.tensor([0, 16, 32], device="cuda", dtype=torch.int32)
    gather_idx = torch.arange(32, device="cuda", dtype=torch.int32) % 16
    with pytest.raises(ValueError, match=re.escape("down_proj_grad: config = 7 breaks the rule: must be 0 (auto) "
                                                   "on an sm_100 GPU")):
        sonicmoe.down_proj_grad(d_out, w2, h, row_score, offs, gather_idx, tile_config="varlen_pingpong_128x128x64")
