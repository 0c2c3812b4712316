"""torch.ops.sonicmoe.grouped_gemm and grouped_gemm_kn on a Blackwell sm_100 GPU (B200, GB200)
against an fp32 torch computation, with the tolerances of the Hopper tests (relative Frobenius
1e-2; the addend alone bit-exact): the sm100 K2 and K6 (CUTLASS's ptr-array grouped GEMM, 1-SM
128x256 or 2-SM 256x256, chosen by rule; K6's router addend fused in its epilogue), whole and
partial rows. Skips elsewhere."""

import re

import pytest
import torch

import sonicmoe
from conftest import ANCHOR_CONFIGS, requires_blackwell
from test_backward_kernels import check_grouped_gemm_kn
from test_grouped_gemm import check, generator, make_inputs, poison_allocator, random_counts, reference

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


# K6 (b (E, k, n_out) read as stored), with and without the router addend: the Hopper test's shapes
# and checks (tests/python/test_backward_kernels.py), auto only. rows_per_expert: auto's 1-SM tile
# (40) and 2-SM pair tile (600). (8, 8, 1) leaves a partial n tile, (72, 136, 8) a partial 16-byte
# chunk past a whole 128 columns.
@pytest.mark.parametrize("addend", [False, True])
@pytest.mark.parametrize("rows_per_expert", [40, 600])
@pytest.mark.parametrize("k,n_out,E", [(512, 1536, 128), (2048, 4096, 16), (72, 136, 8), (8, 8, 1), (256, 4096, 2),
                                       (1024, 4096, 128)])
def test_grouped_gemm_kn(k, n_out, E, rows_per_expert, addend):
    gen = generator("kn", k, n_out, E, rows_per_expert, addend)
    check_grouped_gemm_kn(random_counts(rows_per_expert * E, E, gen), k, n_out, addend, gen)


def test_grouped_gemm_kn_refuses_an_explicit_tile_config():
    gen = generator("kn refused")
    a, b, offs = make_inputs([64, 64], 64, 64, gen)
    b = b.transpose(1, 2).contiguous()
    with pytest.raises(ValueError, match=re.escape("grouped_gemm: config = 7 breaks the rule: must be 0 (auto) on "
                                                   "an sm_100 GPU")):
        sonicmoe.grouped_gemm_kn(a, b, offs, tile_config="varlen_pingpong_128x128x64")


# Token rounding's buffers (partial_rows): offsets[E] stops short of the rows; the rows past it belong
# to no group of the ptr-array kernel, so they are neither read (NaN there) nor written, and the
# rows before it are K2's / K6's. rows_per_expert 40 / 600: auto's 1-SM and 2-SM tiles.
@pytest.mark.parametrize("layout", ["nk", "kn"])
@pytest.mark.parametrize("counts,tail", [([37, 0, 300, 65], 100), ([0, 0, 0], 50), ([513, 1, 1024], 7),
                                         ([600] * 8, 64)])
def test_partial_rows_compute_the_rows_up_to_the_last_offset(layout, counts, tail):
    gen = generator("partial", layout, tuple(counts), tail)
    a, b, offs = make_inputs(counts, 256, 384, gen)
    m = a.shape[0]
    a_full = torch.cat([a, torch.full((tail, a.shape[1]), float("nan"), device="cuda", dtype=a.dtype)])
    ref = reference(a, b, offs)
    poison_allocator(a_full.shape[0] * b.shape[1])
    if layout == "nk":
        out = sonicmoe.grouped_gemm(a_full, b, offs, partial_rows=True)
    else:
        out = sonicmoe.grouped_gemm_kn(a_full, b.transpose(1, 2).contiguous(), offs, partial_rows=True)
    torch.cuda.synchronize()
    assert out.shape == (m + tail, b.shape[1])
    assert torch.isfinite(out[:m]).all(), "NaN/Inf or unwritten rows before offsets[E]"
    if m:
        assert (out[:m].float() - ref).norm() / ref.norm() <= 1e-2
