"""torch.ops.sonicmoe.grouped_gemm on the GPU against an fp32 torch computation."""

import zlib

import pytest
import torch

import sonicmoe
from conftest import ANCHOR_CONFIGS, requires_hopper

pytestmark = [requires_hopper, pytest.mark.usefixtures("fp32_matmul_reference")]

# Down-projection (k = n, n_out = d, E) of every anchor config (benchmarks/anchors).
ANCHOR_SHAPES = {name: (c["n"], c["d"], c["E"]) for name, c in ANCHOR_CONFIGS.items()}
TILE_CONFIGS = list(sonicmoe.GEMM_TILE_CONFIGS)


def generator(*key):
    return torch.Generator(device="cuda").manual_seed(zlib.crc32(repr(key).encode()))


def offsets_from_counts(counts):
    offs = torch.zeros(len(counts) + 1, dtype=torch.int32)
    offs[1:] = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32)
    return offs.cuda()


def random_counts(m_total, E, gen):
    """Ragged split of m_total rows over E experts; some experts get none."""
    weights = torch.rand(E, generator=gen, device="cuda") ** 3
    counts = torch.floor(weights / weights.sum() * m_total).long().cpu()
    counts[0] += m_total - int(counts.sum())
    return counts.tolist()


def make_inputs(counts, k, n_out, gen):
    E, m = len(counts), sum(counts)
    a = torch.randn(m, k, device="cuda", generator=gen).bfloat16()
    b = (torch.randn(E, n_out, k, device="cuda", generator=gen) * k**-0.5).bfloat16()
    return a, b, offsets_from_counts(counts)


def reference(a, b, offs):
    out = torch.empty(a.shape[0], b.shape[1], device=a.device, dtype=torch.float32)
    bounds = offs.tolist()
    for e in range(b.shape[0]):
        lo, hi = bounds[e], bounds[e + 1]
        out[lo:hi] = a[lo:hi].float() @ b[e].float().t()
    return out


def poison_allocator(numel):
    # The op allocates its output from the caching allocator: leave a NaN-filled block of the
    # same size behind so rows the kernel fails to write show up as NaN.
    torch.full((numel,), float("nan"), device="cuda", dtype=torch.bfloat16)


def check(a, b, offs, tile_config="auto"):
    ref = reference(a, b, offs)
    poison_allocator(a.shape[0] * b.shape[1])
    out = sonicmoe.grouped_gemm(a, b, offs, tile_config=tile_config)
    torch.cuda.synchronize()
    assert out.shape == (a.shape[0], b.shape[1]) and out.dtype == torch.bfloat16
    assert torch.isfinite(out).all(), "NaN/Inf or unwritten rows in the output"
    if out.numel():
        err = (out.float() - ref).norm() / ref.norm()
        assert err <= 1e-2, f"relative Frobenius error {err:.3e}"


@pytest.mark.parametrize("tile_config", ["auto"] + [c for c in TILE_CONFIGS if c.startswith("varlen")])
@pytest.mark.parametrize("name", list(ANCHOR_SHAPES))
def test_anchor_down_projection_shapes(name, tile_config):
    # Many tiles per CTA with long k loops: each consumer skips the other's stages.
    k, n_out, E = ANCHOR_SHAPES[name]
    gen = generator(name)
    check(*make_inputs(random_counts(3000, E, gen), k, n_out, gen), tile_config)


@pytest.mark.parametrize("tile_config", TILE_CONFIGS)
@pytest.mark.parametrize("E", [1, 8, 128, 256])
def test_tile_configs_and_expert_counts(tile_config, E):
    gen = generator(tile_config, E)
    check(*make_inputs(random_counts(2000 + 37, E, gen), 256, 384, gen), tile_config)


@pytest.mark.parametrize("tile_config", TILE_CONFIGS)
def test_one_expert_holds_all_rows(tile_config):
    gen = generator("hot", tile_config)
    check(*make_inputs([0, 0, 0, 1111, 0, 0, 0, 0], 512, 256, gen), tile_config)


@pytest.mark.parametrize("m_total", [1, 7, 129, 1000, 4095])
def test_m_total_not_a_multiple_of_the_tile(m_total):
    gen = generator("m", m_total)
    check(*make_inputs(random_counts(m_total, 8, gen), 128, 128, gen))


@pytest.mark.parametrize("tile_config", ["auto"] + [c for c in TILE_CONFIGS if c.startswith("varlen")])
@pytest.mark.parametrize("k,n_out", [(8, 8), (72, 136), (200, 1000), (4096, 64)])
def test_k_and_n_out_not_multiples_of_the_tile(k, n_out, tile_config):
    # Partial N blocks on the varlen kernel's quad-transposed stores, on each tile.
    gen = generator("kn", k, n_out)
    check(*make_inputs(random_counts(600, 4, gen), k, n_out, gen), tile_config)


def test_empty_input_returns_empty():
    b = torch.randn(4, 64, 128, device="cuda").bfloat16()
    a = torch.empty(0, 128, device="cuda", dtype=torch.bfloat16)
    out = sonicmoe.grouped_gemm(a, b, torch.zeros(5, dtype=torch.int32, device="cuda"))
    assert out.shape == (0, 64)


def test_opcheck():
    gen = generator("opcheck")
    a, b, offs = make_inputs(random_counts(300, 8, gen), 128, 256, gen)
    torch.library.opcheck(torch.ops.sonicmoe.grouped_gemm, (a, b, offs))
    torch.library.opcheck(torch.ops.sonicmoe.grouped_gemm, (a, b, offs, 1))


def test_cuda_graph_capture_proves_no_host_sync():
    gen = generator("graph")
    a, b, offs = make_inputs(random_counts(1000, 16, gen), 256, 256, gen)
    sonicmoe.grouped_gemm(a, b, offs)  # warm-up outside the graph
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = sonicmoe.grouped_gemm(a, b, offs)
    # New data and new routing through the same buffers: the graph reads offsets on the device.
    a.copy_(torch.randn(a.shape, device="cuda", generator=gen).bfloat16())
    offs.copy_(offsets_from_counts(random_counts(1000, 16, gen)))
    graph.replay()
    torch.cuda.synchronize()
    ref = reference(a, b, offs)
    assert (out.float() - ref).norm() / ref.norm() <= 1e-2


def test_torch_compile_fullgraph():
    gen = generator("compile")
    a, b, offs = make_inputs(random_counts(500, 8, gen), 128, 128, gen)
    fn = torch.compile(lambda a, b, o: sonicmoe.grouped_gemm(a, b, o) * 2, fullgraph=True)
    out = fn(a, b, offs)
    ref = reference(a, b, offs) * 2
    assert (out.float() - ref).norm() / ref.norm() <= 1e-2


def test_device_errors_on_gpu():
    gen = generator("errors")
    a, b, offs = make_inputs([10, 10], 64, 64, gen)
    with pytest.raises(ValueError, match=r"expert_offsets.device = cpu breaks the rule: must be a CUDA"):
        torch.ops.sonicmoe.grouped_gemm(a, b, offs.cpu())
    flat = torch.randn(20 * 64 + 1, device="cuda").bfloat16()
    shifted = flat[1:].view(20, 64)  # contiguous, but 2 bytes past an aligned address
    with pytest.raises(ValueError, match=r"a.data_ptr\(\) = \d+ breaks the rule: must be 16-byte aligned"):
        torch.ops.sonicmoe.grouped_gemm(shifted, b, offs)
