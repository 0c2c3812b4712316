"""torch.ops.sonicmoe.down_proj_grad refuses tile configurations K4 does not run on, before any
launch. Runs on the CPU (the checks precede the device check)."""

import re

import pytest
import torch

from conftest import requires_extension

pytestmark = requires_extension


def valid(E=4, T=30, m=40, d=64, n=32):
    d_out = torch.randn(T, d).bfloat16()
    w2 = torch.randn(E, d, n).bfloat16()
    h = torch.randn(m, 2 * n).bfloat16()
    row_score = torch.rand(m)
    offs = torch.linspace(0, m, E + 1).round().to(torch.int32)
    gather_idx = torch.randint(0, T, (m,), dtype=torch.int32)
    return d_out, w2, h, row_score, offs, gather_idx


@pytest.mark.parametrize("config,rule", [
    (1, "must be 0 (auto) or a varlen configuration (7 to 11)"),
])
def test_down_proj_grad_refuses_configurations_it_does_not_run_on(config, rule):
    with pytest.raises(ValueError, match=re.escape(f"down_proj_grad: config = {config} breaks the rule: {rule}")):
        torch.ops.sonicmoe.down_proj_grad(*valid(), False, config)


@pytest.mark.parametrize("activation", [-1, 3])
def test_down_proj_grad_refuses_an_activation_it_does_not_have(activation):
    with pytest.raises(ValueError, match=re.escape(f"down_proj_grad: activation = {activation} breaks the rule: "
                                                   "must be a GluActivation: 0 (SwiGLU), 1 (GeGLU) or 2 (ReGLU)")):
        torch.ops.sonicmoe.down_proj_grad(*valid(), False, 0, activation)
