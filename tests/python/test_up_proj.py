"""torch.ops.sonicmoe.up_proj (K1: gather + grouped GEMM + a gated activation: SwiGLU, GeGLU,
ReGLU) on the GPU against fp32."""

import pytest
import torch

import sonicmoe
from conftest import ANCHOR_CONFIGS, requires_hopper
from test_grouped_gemm import generator, offsets_from_counts, random_counts

pytestmark = [requires_hopper, pytest.mark.usefixtures("fp32_matmul_reference")]

# (d, n, E) of every anchor config's up-projection (benchmarks/anchors).
ANCHOR_SHAPES = {name: (c["d"], c["n"], c["E"]) for name, c in ANCHOR_CONFIGS.items()}


def make_inputs(counts, num_tokens, d, n, gen):
    """x, w1 and routing metadata whose rows gather random tokens (repeats allowed)."""
    E, m = len(counts), sum(counts)
    x = torch.randn(num_tokens, d, device="cuda", generator=gen).bfloat16()
    # Drawn in bf16 and scaled in place: deepseek-v3's w1 is 15 GB, its fp32 draw would be 30 GB more.
    w1 = torch.randn(E, 2 * n, d, device="cuda", generator=gen, dtype=torch.bfloat16).mul_(d**-0.5)
    gather_idx = torch.randint(0, max(num_tokens, 1), (m,), device="cuda", generator=gen,
                               dtype=torch.int32)
    return x, w1, offsets_from_counts(counts), gather_idx


def reference(x, w1, offs, gather_idx, activation="swiglu"):
    n = w1.shape[1] // 2
    xs = x.float()[gather_idx.long()]
    h = torch.empty(xs.shape[0], 2 * n, device="cuda")
    bounds = offs.tolist()
    for e in range(w1.shape[0]):
        lo, hi = bounds[e], bounds[e + 1]
        h[lo:hi] = xs[lo:hi] @ w1[e].float().t()
    return h, sonicmoe.reference.glu(h, activation)


def rel_err(out, ref):
    return ((out.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def check(x, w1, offs, gather_idx, keep_h=True, tile_config="auto", activation="swiglu"):
    h_ref, a_ref = reference(x, w1, offs, gather_idx, activation)
    m, n = gather_idx.shape[0], w1.shape[1] // 2
    # Outputs come from the caching allocator: leave NaN-filled blocks of their sizes behind
    # so anything the kernel fails to write shows up.
    torch.full((m * 2 * n,), float("nan"), device="cuda", dtype=torch.bfloat16)
    torch.full((m * n,), float("nan"), device="cuda", dtype=torch.bfloat16)
    h, a = sonicmoe.up_proj(x, w1, offs, gather_idx, keep_h=keep_h, tile_config=tile_config, activation=activation)
    torch.cuda.synchronize()
    assert a.shape == (m, n) and a.dtype == torch.bfloat16
    assert h.shape == ((m if keep_h else 0), 2 * n)
    assert torch.isfinite(a).all(), "NaN/Inf or unwritten rows in a"
    if m:
        assert rel_err(a, a_ref) <= 1e-2
    if keep_h and m:
        assert torch.isfinite(h).all(), "NaN/Inf or unwritten rows in h"
        assert rel_err(sonicmoe.h_column_order(h), h_ref) <= 1e-2


# Every varlen configuration: ping-pong 128 x 128 (H and A staged through shared memory),
# cooperative 128 x 256 (two B boxes per SwiGLU half) or cooperative 256 x 128 (both store from
# registers through the quad transpose).
VARLEN_CONFIGS = pytest.mark.parametrize(
    "tile_config", list(sonicmoe.VARLEN_TILE_CONFIGS))


@VARLEN_CONFIGS
@pytest.mark.parametrize("name", list(ANCHOR_SHAPES))
def test_anchor_up_projection_shapes(name, tile_config):
    d, n, E = ANCHOR_SHAPES[name]
    gen = generator("up", name)
    check(*make_inputs(random_counts(2000, E, gen), 700, d, n, gen), tile_config=tile_config)


@VARLEN_CONFIGS
@pytest.mark.parametrize("E", [1, 8, 128, 256])
def test_expert_counts_with_empty_experts(E, tile_config):
    gen = generator("up-E", E)
    check(*make_inputs(random_counts(3000 + 37, E, gen), 1000, 256, 192, gen), tile_config=tile_config)


@VARLEN_CONFIGS
def test_one_expert_holds_all_rows(tile_config):
    gen = generator("up-hot")
    check(*make_inputs([0, 0, 0, 1111, 0, 0, 0, 0], 300, 512, 128, gen), tile_config=tile_config)


@VARLEN_CONFIGS
@pytest.mark.parametrize("m_total", [1, 7, 129, 1000, 4095])
def test_m_total_not_a_multiple_of_the_tile(m_total, tile_config):
    gen = generator("up-m", m_total)
    check(*make_inputs(random_counts(m_total, 8, gen), 64, 128, 64, gen), tile_config=tile_config)


@VARLEN_CONFIGS
def test_many_tiles_per_cta_and_deep_k(tile_config):
    # More tiles than SMs, k loops longer than the stage ring, odd and even m-block counts.
    gen = generator("up-deep")
    check(*make_inputs(random_counts(64 * 300, 64, gen), 2000, 1024, 256, gen), tile_config=tile_config)


@VARLEN_CONFIGS
@pytest.mark.parametrize("d,n", [(8, 8), (72, 40), (200, 1000), (1000, 200), (4096, 64)])
def test_d_and_n_not_multiples_of_the_tile(d, n, tile_config):
    # Partial N blocks on every store path: the last 16-byte chunks of a row past n are skipped.
    gen = generator("up-dn", d, n)
    check(*make_inputs(random_counts(600, 4, gen), 333, d, n, gen), tile_config=tile_config)


# GeGLU and ReGLU on every varlen configuration over a few shapes (SwiGLU runs the full matrix
# above; the epilogue's math is the only difference): a partial N block (n 40), several tiles a
# CTA (n 256, 64 experts), a clustered tile's shape (d 4096), empty experts.
@VARLEN_CONFIGS
@pytest.mark.parametrize("activation", ["swiglu", "geglu", "reglu"])
@pytest.mark.parametrize("m_total,E,T,d,n", [(600, 4, 333, 72, 40), (64 * 300, 64, 2000, 1024, 256),
                                             (1500, 16, 400, 4096, 128), (3037, 128, 1000, 256, 192)])
def test_gated_activations(m_total, E, T, d, n, activation, tile_config):
    gen = generator("up-act", m_total, E, d, n, activation)
    check(*make_inputs(random_counts(m_total, E, gen), T, d, n, gen), tile_config=tile_config, activation=activation)


@pytest.mark.parametrize("activation", ["geglu", "reglu"])
def test_gated_activations_auto_and_without_h(activation):
    gen = generator("up-act-auto", activation)
    args = make_inputs(random_counts(2000, 32, gen), 700, 2048, 768, gen)
    check(*args, activation=activation)
    check(*args, keep_h=False, activation=activation)


def test_without_h():
    gen = generator("up-no-h")
    check(*make_inputs(random_counts(1500, 16, gen), 400, 256, 256, gen), keep_h=False)


def test_empty_input_returns_empty():
    x = torch.randn(5, 128, device="cuda").bfloat16()
    w1 = torch.randn(4, 128, 128, device="cuda").bfloat16()
    h, a = sonicmoe.up_proj(x, w1, torch.zeros(5, dtype=torch.int32, device="cuda"),
                            torch.zeros(0, dtype=torch.int32, device="cuda"))
    assert h.shape == (0, 128) and a.shape == (0, 64)


def test_opcheck():
    gen = generator("up-opcheck")
    args = make_inputs(random_counts(300, 8, gen), 100, 128, 64, gen)
    torch.library.opcheck(torch.ops.sonicmoe.up_proj, args)
    torch.library.opcheck(torch.ops.sonicmoe.up_proj, (*args, False))
    for activation in sonicmoe.GLU_ACTIVATIONS.values():
        torch.library.opcheck(torch.ops.sonicmoe.up_proj, (*args, True, False, 0, activation))


def test_cuda_graph_capture_with_new_routing():
    gen = generator("up-graph")
    x, w1, offs, gather_idx = make_inputs(random_counts(1000, 16, gen), 500, 256, 128, gen)
    sonicmoe.up_proj(x, w1, offs, gather_idx)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        h, a = sonicmoe.up_proj(x, w1, offs, gather_idx)
    x.copy_(torch.randn(x.shape, device="cuda", generator=gen).bfloat16())
    offs.copy_(offsets_from_counts(random_counts(1000, 16, gen)))
    gather_idx.copy_(torch.randint(0, 500, gather_idx.shape, device="cuda", generator=gen))
    graph.replay()
    torch.cuda.synchronize()
    h_ref, a_ref = reference(x, w1, offs, gather_idx)
    assert rel_err(sonicmoe.h_column_order(h), h_ref) <= 1e-2 and rel_err(a, a_ref) <= 1e-2


def test_device_errors_on_gpu():
    gen = generator("up-errors")
    x, w1, offs, gather_idx = make_inputs([10, 10], 20, 64, 64, gen)
    with pytest.raises(ValueError, match=r"up_proj: gather_idx.device = cpu breaks the rule"):
        torch.ops.sonicmoe.up_proj(x, w1, offs, gather_idx.cpu())
