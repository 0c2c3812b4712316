"""sonicmoe.h_column_order: up_proj's H from the kernels' column order
(csrc/common/h_column_order.h) to [gate | up] in column order. Pure torch, on the CPU."""

import pytest
import torch

import sonicmoe


def h_position(col, n):
    """Where column col (< n) of a half sits in the kernels' order, written out per column: in a
    whole 32-column block, column 8 b + 2 l + v is at 8 l + 2 b + v."""
    block, j = col // 32 * 32, col % 32
    if block + 32 > n:
        return col
    b, l, v = j // 8, j // 2 % 4, j % 2
    return block + 8 * l + 2 * b + v


@pytest.mark.parametrize("n", [8, 32, 40, 64, 200, 1000, 1024])
def test_h_column_order_undoes_the_kernels_order(n):
    m = 3
    want = torch.arange(m * 2 * n, dtype=torch.float32).reshape(m, 2 * n)  # H in column order
    kernel_order = torch.empty_like(want)
    for half in range(2):
        for col in range(n):
            kernel_order[:, half * n + h_position(col, n)] = want[:, half * n + col]
    assert torch.equal(sonicmoe.h_column_order(kernel_order), want)
    assert torch.equal(sonicmoe.h_column_order(want), kernel_order)  # its own inverse


def test_h_column_order_of_no_rows():
    assert sonicmoe.h_column_order(torch.empty(0, 128)).shape == (0, 128)


@pytest.mark.parametrize("shape", [(4, 7), (128,), (2, 3, 4)])
def test_h_column_order_rejects_what_is_not_m_by_2n(shape):
    with pytest.raises(ValueError, match=r"h_column_order: h.shape = \[.*\] breaks the rule: must be 2-D \(M, 2n\)"):
        sonicmoe.h_column_order(torch.empty(shape))
