"""K6 (grouped_gemm_kn) and K4 (down_proj_grad) against fp32 torch, on the GPU."""

import pytest
import torch
import torch.nn.functional as F

import sonicmoe
from conftest import requires_hopper
from test_grouped_gemm import generator, offsets_from_counts, random_counts

pytestmark = [requires_hopper, pytest.mark.usefixtures("fp32_matmul_reference")]


def rel(a, b):
    return ((a.float() - b).norm() / b.norm().clamp_min(1e-30)).item()


# K4 on every varlen configuration; a 128 x 256 tile writes two score-gradient slots (128
# columns each), the second one only where it starts below n.
K4_CONFIGS = pytest.mark.parametrize(
    "tile_config", list(sonicmoe.VARLEN_TILE_CONFIGS))


# K6's configurations: every varlen op's and grouped_gemm's own ping-pong 128 x 192.
K6_TILE_CONFIGS = list(sonicmoe.VARLEN_TILE_CONFIGS) + ["varlen_pingpong_128x192x64"]


# "auto" takes the cooperative 128 x 256 tile for a wide output over experts with >= 1024 rows
# (sm90/heuristics.h): (256, 4096, 2) reaches it. With the addend (the router's part of dx folded
# into K6: RowAddendStoreEpilogue), + addend_scale[r] * addend_rows[e] in fp32 before the rounding;
# (8, 8, 1) leaves a partial n tile on every configuration, (72, 136, 8) one 16-byte chunk past a
# whole 128-column tile (on the 192-column tile, 136 of its first 192 columns); (512, 1536, 128)
# runs whole 192-column tiles, n_out 4096 a 64-column last one.
@pytest.mark.parametrize("addend", [False, True])
@pytest.mark.parametrize("tile_config", ["auto"] + K6_TILE_CONFIGS)
@pytest.mark.parametrize("k,n_out,E", [(512, 1536, 128), (2048, 4096, 16), (72, 136, 8), (8, 8, 1), (256, 4096, 2),
                                       (1024, 4096, 128)])
def test_grouped_gemm_kn(k, n_out, E, tile_config, addend):
    gen = generator("kn", k, n_out, E, addend)
    check_grouped_gemm_kn(random_counts(3000, E, gen), k, n_out, addend, gen, tile_config)


def check_grouped_gemm_kn(counts, k, n_out, addend, gen, tile_config="auto"):
    """K6 (grouped_gemm_kn) against its fp32 spec, out[r] = a[r] @ b[e] (+ addend_scale[r] *
    addend_rows[e]), on fresh random inputs over the given expert row counts; with the addend also
    the addend alone (a = 0), which must equal its one bf16 rounding exactly. Shared with the sm100
    tests."""
    E = len(counts)
    a = torch.randn(sum(counts), k, device="cuda", generator=gen).bfloat16()
    b = (torch.randn(E, k, n_out, device="cuda", generator=gen) * k**-0.5).bfloat16()
    offs = offsets_from_counts(counts)
    scale = torch.randn(a.shape[0], device="cuda", generator=gen) if addend else None
    rows = torch.randn(E, n_out, device="cuda", generator=gen).bfloat16() if addend else None
    torch.full((a.shape[0] * n_out,), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = sonicmoe.grouped_gemm_kn(a, b, offs, tile_config=tile_config, addend_scale=scale, addend_rows=rows)
    ref = torch.empty(a.shape[0], n_out, device="cuda")
    bounds = offs.tolist()
    for e in range(E):
        lo, hi = bounds[e], bounds[e + 1]
        ref[lo:hi] = a[lo:hi].float() @ b[e].float() + (scale[lo:hi, None] * rows[e].float() if addend else 0)
    assert torch.isfinite(out).all()
    assert rel(out, ref) <= 1e-2
    if addend:  # the addend alone (a = 0): each row is its scaled expert row, rounded once
        zero = sonicmoe.grouped_gemm_kn(torch.zeros_like(a), b, offs, tile_config=tile_config, addend_scale=scale,
                                        addend_rows=rows)
        expert = torch.repeat_interleave(torch.arange(E, device="cuda"), torch.tensor(counts, device="cuda"))
        assert torch.equal(zero, (scale[:, None] * rows[expert].float()).bfloat16())


def check_down_proj_grad(T, d, n, E, K, tile_config, tail_rows=0, activation="swiglu"):
    """K4 against its fp32 spec from the same H. tail_rows > 0 runs it on partial_rows buffers
    (token rounding's): M_total = T*K + tail_rows, and expert_offsets[E] stops at T*K. activation:
    the gated activation K4 differentiates (H itself does not depend on it)."""
    gen = generator("k4", T, d, n, E, K, tail_rows) if activation == "swiglu" else \
        generator("k4", T, d, n, E, K, tail_rows, activation)
    x = torch.randn(T, d, device="cuda", generator=gen).bfloat16()
    w1 = (torch.randn(E, 2 * n, d, device="cuda", generator=gen) * d**-0.5).bfloat16()
    w2 = (torch.randn(E, d, n, device="cuda", generator=gen) * n**-0.5).bfloat16()
    scores, experts = torch.rand(T, E, device="cuda", generator=gen).softmax(-1).topk(K, dim=-1)
    d_out = torch.randn(T, d, device="cuda", generator=gen).bfloat16()
    meta = sonicmoe.routing_metadata(experts, E)
    h, _ = sonicmoe.up_proj(x, w1, meta.expert_offsets, meta.gather_idx)
    rows = meta.rev_idx.reshape(-1).long()
    row_score = scores.new_empty(rows.numel())
    row_score[rows] = scores.reshape(-1)
    valid = T * K
    h_in, row_score_in, gather_in = h, row_score, meta.gather_idx
    if tail_rows:  # rows past expert_offsets[E] hold garbage the kernel must not read as rows
        h_in = torch.cat([h, torch.randn(tail_rows, 2 * n, device="cuda", generator=gen).bfloat16()])
        row_score_in = torch.cat([row_score, torch.rand(tail_rows, device="cuda", generator=gen)])
        gather_in = torch.cat([meta.gather_idx, torch.randint(0, T, (tail_rows,), device="cuda", generator=gen,
                                                              dtype=torch.int32)])
    d_h, a_scaled, ds_part = sonicmoe.down_proj_grad(d_out, w2, h_in, row_score_in, meta.expert_offsets, gather_in,
                                                     partial_rows=tail_rows > 0, tile_config=tile_config,
                                                     activation=activation)
    d_h, a_scaled, ds_part = d_h[:valid], a_scaled[:valid], ds_part[:valid]
    # fp32 spec from the same H
    hf = sonicmoe.h_column_order(h).float()
    gate, up = hf[:, :n], hf[:, n:]
    a = sonicmoe.reference.glu_activation(gate, activation) * up
    d_out_rows = d_out.float()[meta.gather_idx.long()]
    d_a_prime = torch.empty_like(a)
    bounds = meta.expert_offsets.tolist()
    for e in range(E):
        d_a_prime[bounds[e]:bounds[e + 1]] = d_out_rows[bounds[e]:bounds[e + 1]] @ w2[e].float()
    want_d_h = sonicmoe.reference.glu_backward(hf, row_score[:, None] * d_a_prime, activation)
    assert rel(d_h, want_d_h) <= 1e-2
    assert rel(a_scaled, row_score[:, None] * a) <= 1e-2
    assert rel(ds_part.sum(1), (d_a_prime * a).sum(1)) <= 1e-2
    # Every slot is written (ds_part comes from torch.empty): each holds its own 128 columns.
    slots = ds_part.shape[1]
    want_part = F.pad(d_a_prime * a, (0, slots * 128 - n)).view(-1, slots, 128).sum(-1)
    assert rel(ds_part, want_part) <= 1e-2


# (8192, 256, 1024, 4, 2): 512 tiles of 128 x 256 (1024 of 128 x 128) on 132 SMs, so each CTA runs
# several tiles in a row and the epilogue's barriers (H by TMA on the cooperative tile) go
# through several phases; the other cases give every CTA at most one tile.
@K4_CONFIGS
@pytest.mark.parametrize("T,d,n,E,K", [(700, 1536, 256, 128, 8), (300, 256, 200, 8, 2), (300, 256, 384, 8, 2),
                                       (50, 64, 64, 4, 1), (8192, 256, 1024, 4, 2)])
def test_down_proj_grad_matches_the_reference_spec(T, d, n, E, K, tile_config):
    check_down_proj_grad(T, d, n, E, K, tile_config)


# "auto" takes the clustered cooperative 128 x 256 tile where n % 256 == 0 and d >= 2048
# (sm90/heuristics.h): the first two cases reach it, the third takes ping-pong.
@pytest.mark.parametrize("T,d,n,E,K", [(200, 4096, 256, 8, 2), (200, 2048, 256, 8, 2), (200, 1536, 256, 8, 2)])
def test_down_proj_grad_auto(T, d, n, E, K):
    check_down_proj_grad(T, d, n, E, K, "auto")


# Token rounding runs K4 on upper-bound buffers: rows past expert_offsets[E] are left alone.
@pytest.mark.parametrize("tile_config", ["auto"] + list(sonicmoe.VARLEN_TILE_CONFIGS))
@pytest.mark.parametrize("T,d,n,E,K,tail_rows", [(300, 256, 256, 8, 2, 77), (200, 4096, 512, 8, 2, 200)])
def test_down_proj_grad_partial_rows(T, d, n, E, K, tail_rows, tile_config):
    check_down_proj_grad(T, d, n, E, K, tile_config, tail_rows)


# GeGLU and ReGLU on every varlen configuration over a few shapes (SwiGLU runs the full matrix
# above; only the epilogue's math differs): a partial n tile (n 200), several tiles a CTA
# (8192 x 1024), and token rounding's partial_rows buffers.
@K4_CONFIGS
@pytest.mark.parametrize("activation", ["geglu", "reglu"])
@pytest.mark.parametrize("T,d,n,E,K,tail_rows", [(300, 256, 200, 8, 2, 0), (8192, 256, 1024, 4, 2, 0),
                                                 (300, 256, 256, 8, 2, 77)])
def test_down_proj_grad_gated_activations(T, d, n, E, K, tail_rows, activation, tile_config):
    check_down_proj_grad(T, d, n, E, K, tile_config, tail_rows, activation)


@pytest.mark.parametrize("activation", ["geglu", "reglu"])
def test_down_proj_grad_gated_activations_auto(activation):
    check_down_proj_grad(200, 4096, 256, 8, 2, "auto", activation=activation)
