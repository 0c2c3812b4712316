"""The tile autotuner (csrc/host/autotune.h) through the torch ops: a "auto" call tunes its
problem class once into the cache file and reuses it; CUDA graph capture never tunes; the
switch keeps the rules; results are the chosen tile's, correct either way."""

import pathlib

import pytest
import torch

import sonicmoe
from conftest import requires_hopper

pytestmark = requires_hopper


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SONICMOE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("SONICMOE_AUTOTUNE", raising=False)
    sonicmoe.autotune_clear()
    yield tmp_path
    sonicmoe.autotune_clear()


def lines(path):
    p = pathlib.Path(path)
    return p.read_text().splitlines() if p.exists() else []


def problem(m, k, n_out, E=4, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", generator=g).bfloat16()
    b = (torch.randn(E, n_out, k, device="cuda", generator=g) * k**-0.5).bfloat16()
    counts = torch.full((E,), m // E, dtype=torch.int64)
    counts[0] += m - int(counts.sum())
    offs = torch.zeros(E + 1, dtype=torch.int32, device="cuda")
    offs[1:] = counts.cumsum(0).to(torch.int32).cuda()
    want = torch.cat([a[offs[e]:offs[e + 1]].float() @ b[e].float().t() for e in range(E)])
    return a, b, offs, want


def rel(x, y):
    return ((x.float() - y).norm() / y.norm()).item()


def test_first_call_tunes_then_the_class_reuses_the_file(cache_dir):
    path = sonicmoe.autotune_cache_path()
    assert path.startswith(str(cache_dir)) and torch.cuda.get_device_name().replace(" ", "_") in path
    a, b, offs, want = problem(1000, 256, 384)
    assert rel(sonicmoe.grouped_gemm(a, b, offs), want) < 1e-2
    assert len(lines(path)) == 1 and lines(path)[0].split()[0] == "2"  # op K2
    assert rel(sonicmoe.grouped_gemm(a, b, offs), want) < 1e-2
    sonicmoe.autotune_clear()  # as a new process: the file answers
    assert rel(sonicmoe.grouped_gemm(a, b, offs), want) < 1e-2
    a, b, offs, want = problem(600, 256, 384, seed=1)  # 600 and 1000 rows: one class (bit width 10)
    assert rel(sonicmoe.grouped_gemm(a, b, offs), want) < 1e-2
    assert len(lines(path)) == 1


def test_capture_does_not_tune_and_the_switch_keeps_the_rules(cache_dir, monkeypatch):
    path = sonicmoe.autotune_cache_path()
    a, b, offs, want = problem(1000, 512, 256)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out = sonicmoe.grouped_gemm(a, b, offs)
    assert lines(path) == []
    graph.replay()
    torch.cuda.synchronize()
    assert rel(out, want) < 1e-2
    monkeypatch.setenv("SONICMOE_AUTOTUNE", "0")
    assert rel(sonicmoe.grouped_gemm(a, b, offs), want) < 1e-2
    assert lines(path) == []
    monkeypatch.delenv("SONICMOE_AUTOTUNE")
    assert rel(sonicmoe.grouped_gemm(a, b, offs), want) < 1e-2
    assert len(lines(path)) == 1


def test_every_tuned_op_of_the_layer_writes_its_class(cache_dir):
    T, d, n, E, K = 512, 256, 128, 8, 2
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(T, d, device="cuda", generator=g).bfloat16().requires_grad_()
    router = (torch.randn(E, d, device="cuda", generator=g) * d**-0.5).bfloat16().requires_grad_()
    w1 = (torch.randn(E, 2 * n, d, device="cuda", generator=g) * d**-0.5).bfloat16().requires_grad_()
    w2 = (torch.randn(E, d, n, device="cuda", generator=g) * n**-0.5).bfloat16().requires_grad_()
    sonicmoe.moe(x, router, w1, w2, K).float().square().sum().backward()
    ops = sorted({int(line.split()[0]) for line in lines(sonicmoe.autotune_cache_path())})
    assert ops == [1, 2, 3, 4, 5]  # K1, K2, K6, K4, K5 / K7
