"""torch.ops.sonicmoe.up_proj rejects bad input before any launch, naming the argument, its
value and the rule. Runs on the CPU (the checks precede the device check)."""

import re

import pytest
import torch

from conftest import requires_extension

pytestmark = requires_extension


def valid(E=4, T=30, m=40, d=64, n=32):
    x = torch.randn(T, d).bfloat16()
    w1 = torch.randn(E, 2 * n, d).bfloat16()
    offs = torch.linspace(0, m, E + 1).round().to(torch.int32)
    gather_idx = torch.randint(0, T, (m,), dtype=torch.int32)
    return x, w1, offs, gather_idx


CASES = [
    ("x dtype", lambda x, w, o, g: (x.float(), w, o, g), TypeError,
     "up_proj: x.dtype = Float breaks the rule: must be BFloat16"),
    ("w1 dtype", lambda x, w, o, g: (x, w.half(), o, g), TypeError,
     "up_proj: w1.dtype = Half breaks the rule: must be BFloat16"),
    ("gather_idx dtype", lambda x, w, o, g: (x, w, o, g.long()), TypeError,
     "up_proj: gather_idx.dtype = Long breaks the rule: must be Int"),
    ("w1 dim", lambda x, w, o, g: (x, w[0], o, g), ValueError,
     "up_proj: w1.shape = [64, 64] breaks the rule: must be 3-D (num_experts, 2n, d)"),
    ("w1 odd rows", lambda x, w, o, g: (x, w[:, :63].contiguous(), o, g), ValueError,
     "up_proj: w1.shape = [4, 63, 64] breaks the rule: w1.shape[1] must be even"),
    ("d mismatch", lambda x, w, o, g: (x[:, :56].contiguous(), w, o, g), ValueError,
     "up_proj: x.shape = [30, 56] breaks the rule: x.shape[1] must equal w1.shape[2] = 64 (d)"),
    ("offsets length", lambda x, w, o, g: (x, w, o[:-1], g), ValueError,
     "up_proj: expert_offsets.shape = [4] breaks the rule: must be (num_experts + 1,) = (5,)"),
    ("w1 contiguity", lambda x, w, o, g: (x, w.transpose(1, 2).contiguous().transpose(1, 2), o, g),
     ValueError, "up_proj: w1.stride() = [4096, 1, 64] breaks the rule: must be contiguous"),
    ("n multiple of 8", lambda x, w, o, g: (x, w[:, :60].contiguous(), o, g), ValueError,
     "up_proj: n = 30 breaks the rule: must be a positive multiple of 8"),
    ("d multiple of 8", lambda x, w, o, g: (x[:, :60].contiguous(), w[:, :, :60].contiguous(), o, g),
     ValueError, "up_proj: d = 60 breaks the rule: must be a positive multiple of 8"),
    ("device", lambda x, w, o, g: (x, w, o, g), ValueError,
     "up_proj: x.device = cpu breaks the rule: must be a CUDA device"),
]


@pytest.mark.parametrize("name,mutate,exc,message", CASES, ids=[c[0] for c in CASES])
def test_up_proj_rejects(name, mutate, exc, message):
    args = mutate(*valid())
    with pytest.raises(exc, match=re.escape(message)):
        torch.ops.sonicmoe.up_proj(*args)


def test_up_proj_runs_on_the_varlen_configurations_only():
    with pytest.raises(ValueError, match=re.escape(
            "up_proj: config = 3 breaks the rule: must be 0 (auto) or a varlen configuration (7 to 11)")):
        torch.ops.sonicmoe.up_proj(*valid(), True, False, 3)
    with pytest.raises(ValueError, match=re.escape(  # grouped_gemm's own tile (K2, K6)
            "up_proj: config = 12 breaks the rule: must be 0 (auto) or a varlen configuration (7 to 11)")):
        torch.ops.sonicmoe.up_proj(*valid(), True, False, 12)
    with pytest.raises(ValueError, match=re.escape(
            "up_proj: tile_config = 13 breaks the rule: must be 0 (auto) or a GemmTileConfig")):
        torch.ops.sonicmoe.up_proj(*valid(), True, False, 13)


def test_fake_tensor_shapes_without_a_gpu():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(100, 256, dtype=torch.bfloat16)
        w1 = torch.empty(8, 1024, 256, dtype=torch.bfloat16)
        offs = torch.empty(9, dtype=torch.int32)
        gather_idx = torch.empty(800, dtype=torch.int32)
        h, a = torch.ops.sonicmoe.up_proj(x, w1, offs, gather_idx)
        h0, a0 = torch.ops.sonicmoe.up_proj(x, w1, offs, gather_idx, False)
    assert h.shape == (800, 1024) and a.shape == (800, 512) and h0.shape == (0, 1024)


@pytest.mark.parametrize("activation", [-1, 3])
def test_up_proj_refuses_an_activation_it_does_not_have(activation):
    with pytest.raises(ValueError, match=re.escape(f"up_proj: activation = {activation} breaks the rule: must be a "
                                                   "GluActivation: 0 (SwiGLU), 1 (GeGLU) or 2 (ReGLU)")):
        torch.ops.sonicmoe.up_proj(*valid(), True, False, 0, activation)
