"""torch.ops.sonicmoe.grouped_gemm on a Blackwell sm_100 GPU (B200, GB200) against an fp32 torch
computation, with the tolerance of the Hopper tests (relative Frobenius 1e-2): the sm100 K2
(CUTLASS's ptr-array grouped GEMM, 1-SM 128x256 or 2-SM 256x256, chosen by rule). Skips
elsewhere; the other ops are refused there by name."""

import re

import pytest
import torch

import sonicmoe
from conftest import ANCHOR_CONFIGS, requires_blackwell
from test_grouped_gemm import check, generator, make_inputs, random_counts

pytestmark = [requires_blackwell, pytest.mark.usefixtures("fp32_matmul_reference")]

ANCHOR_SHAPES = {name: (c["n"], c["d"], c["E"]) for name, c in ANCHOR_CONFIGS.items()}


@pytest.mark.parametrize("name", list(ANCHOR_SHAPES))
@pytest.mark.parametrize("rows_per_expert", [40, 600])  # auto: the 1-SM tile, the 2-SM pair tile
def test_anchor_down_projection_shapes(name, rows_per_expert):
    k, n_out, E = ANCHOR_SHAPES[name]
    gen = generator(name, rows_per_expert)
    check(*make_inputs(random_counts(rows_per_expert * E, E, gen), k, n_out, gen))


@pytest.mark.parametrize("counts", [[0, 37, 128, 0, 1, 300, 0, 65], [0, 0, 777, 0], [200], [513, 1, 1024]])
@pytest.mark.parametrize("k,n_out", [(8, 8), (72, 136), (512, 256), (4096, 64)])
def test_ragged_experts_and_edge_sizes(counts, k, n_out):
    gen = generator(tuple(counts), k, n_out)
    check(*make_inputs(counts, k, n_out, gen))


def test_empty_input_returns_empty():
    gen = generator("empty")
    a, b, offs = make_inputs([0, 0], 64, 64, gen)
    assert sonicmoe.grouped_gemm(a, b, offs).shape == (0, 64)


def test_explicit_tile_config_is_refused_naming_the_rule():
    gen = generator("explicit")
    a, b, offs = make_inputs([64, 64], 64, 64, gen)
    with pytest.raises(ValueError, match=re.escape("grouped_gemm: config = 7 breaks the rule: must be 0 (auto) on "
                                                   "an sm_100 GPU")):
        sonicmoe.grouped_gemm(a, b, offs, tile_config="varlen_pingpong_128x128x64")


def test_ops_without_sm100_kernels_are_refused_by_name():
    gen = generator("kn")
    a, b, offs = make_inputs([64, 64], 64, 64, gen)
    with pytest.raises(ValueError, match=re.escape("grouped_gemm_kn: no sm_100a kernel yet")):
        sonicmoe.grouped_gemm_kn(a, b.transpose(1, 2).contiguous(), offs)
