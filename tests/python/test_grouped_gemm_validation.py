"""torch.ops.sonicmoe.grouped_gemm rejects bad input before any launch, with a message that
names the argument, its value and the rule. Runs on the CPU (the checks precede the device
check), so CI covers every message."""

import re

import pytest
import torch

import sonicmoe
from conftest import requires_extension

pytestmark = requires_extension


def valid(E=4, m=40, k=64, n_out=32):
    a = torch.randn(m, k).bfloat16()
    b = torch.randn(E, n_out, k).bfloat16()
    offs = torch.linspace(0, m, E + 1).round().to(torch.int32)
    return a, b, offs


CASES = [
    ("a dtype", lambda a, b, o: (a.float(), b, o), TypeError,
     "grouped_gemm: a.dtype = Float breaks the rule: must be BFloat16"),
    ("b dtype", lambda a, b, o: (a, b.half(), o), TypeError,
     "grouped_gemm: b.dtype = Half breaks the rule: must be BFloat16"),
    ("offsets dtype", lambda a, b, o: (a, b, o.long()), TypeError,
     "grouped_gemm: expert_offsets.dtype = Long breaks the rule: must be Int"),
    ("a dim", lambda a, b, o: (a[None], b, o), ValueError,
     "grouped_gemm: a.shape = [1, 40, 64] breaks the rule: must be 2-D (m_total, k)"),
    ("b dim", lambda a, b, o: (a, b[0], o), ValueError,
     "grouped_gemm: b.shape = [32, 64] breaks the rule: must be 3-D (num_experts, n_out, k)"),
    ("offsets dim", lambda a, b, o: (a, b, o[None]), ValueError,
     "grouped_gemm: expert_offsets.shape = [1, 5] breaks the rule: must be 1-D (num_experts + 1)"),
    ("no experts", lambda a, b, o: (a, b[:0], o[:1]), ValueError,
     "grouped_gemm: b.shape = [0, 32, 64] breaks the rule: needs at least one expert"),
    ("offsets length", lambda a, b, o: (a, b, o[:-1]), ValueError,
     "grouped_gemm: expert_offsets.shape = [4] breaks the rule: must be (num_experts + 1,) = (5,)"),
    ("k mismatch", lambda a, b, o: (a[:, :56].contiguous(), b, o), ValueError,
     "grouped_gemm: a.shape = [40, 56] breaks the rule: a.shape[1] must equal b.shape[2] = 64 (k)"),
    ("a contiguity", lambda a, b, o: (a.t().contiguous().t(), b, o), ValueError,
     "grouped_gemm: a.stride() = [1, 40] breaks the rule: must be contiguous"),
    ("b contiguity", lambda a, b, o: (a, b.transpose(1, 2).contiguous().transpose(1, 2), o),
     ValueError, "grouped_gemm: b.stride() = [2048, 1, 32] breaks the rule: must be contiguous"),
    ("k multiple of 8", lambda a, b, o: (a[:, :60].contiguous(), b[:, :, :60].contiguous(), o),
     ValueError, "grouped_gemm: k = 60 breaks the rule: must be a positive multiple of 8"),
    ("n_out multiple of 8", lambda a, b, o: (a, b[:, :30].contiguous(), o), ValueError,
     "grouped_gemm: n_out = 30 breaks the rule: must be a positive multiple of 8"),
    ("device", lambda a, b, o: (a, b, o), ValueError,
     "grouped_gemm: a.device = cpu breaks the rule: must be a CUDA device"),
]


@pytest.mark.parametrize("name,mutate,exc,message", CASES, ids=[c[0] for c in CASES])
def test_grouped_gemm_rejects(name, mutate, exc, message):
    args = mutate(*valid())
    with pytest.raises(exc, match=re.escape(message)):
        torch.ops.sonicmoe.grouped_gemm(*args)


def test_grouped_gemm_rejects_unknown_tile_config_number():
    with pytest.raises(ValueError, match=re.escape(
            "grouped_gemm: tile_config = 13 breaks the rule: must be 0 (auto) or a GemmTileConfig")):
        torch.ops.sonicmoe.grouped_gemm(*valid(), 13)


def test_python_wrapper_rejects_unknown_tile_config_name():
    with pytest.raises(ValueError, match="tile_config: 'huge' is not one of"):
        sonicmoe.grouped_gemm(*valid(), tile_config="huge")


def test_fake_tensor_shape_without_a_gpu():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a = torch.empty(1000, 256, dtype=torch.bfloat16)
        b = torch.empty(8, 1536, 256, dtype=torch.bfloat16)
        offs = torch.empty(9, dtype=torch.int32)
        out = torch.ops.sonicmoe.grouped_gemm(a, b, offs)
    assert out.shape == (1000, 1536) and out.dtype == torch.bfloat16


def test_grouped_gemm_rejects_misaligned_data_pointer():
    a, b, offs = valid()
    flat = torch.randn(a.numel() + 1).bfloat16()
    shifted = flat[1:].view(a.shape)  # contiguous, 2 bytes past an aligned address
    with pytest.raises(ValueError, match=r"grouped_gemm: a.data_ptr\(\) = \d+ breaks the rule: "
                                         r"must be 16-byte aligned \(TMA\)"):
        torch.ops.sonicmoe.grouped_gemm(shifted, b, offs)


def valid_kn_addend(E=4, m=40, k=64, n_out=32):
    a = torch.randn(m, k).bfloat16()
    b = torch.randn(E, k, n_out).bfloat16()
    offs = torch.linspace(0, m, E + 1).round().to(torch.int32)
    return a, b, offs, torch.randn(m), torch.randn(E, n_out).bfloat16()


KN_ADDEND_CASES = [
    ("scale alone", lambda s, r: (s, None),
     "grouped_gemm_kn: addend_scale = a tensor breaks the rule: comes with addend_rows: both or neither"),
    ("rows alone", lambda s, r: (None, r),
     "grouped_gemm_kn: addend_scale = None breaks the rule: comes with addend_rows: both or neither"),
    ("scale dtype", lambda s, r: (s.bfloat16(), r), "grouped_gemm_kn: addend_scale.dtype = BFloat16 breaks the rule"),
    ("rows dtype", lambda s, r: (s, r.float()), "grouped_gemm_kn: addend_rows.dtype = Float breaks the rule"),
    ("scale length", lambda s, r: (s[:-1], r),
     "grouped_gemm_kn: addend_scale.shape = [39] breaks the rule: must be (m_total,) = (40,)"),
    ("rows shape", lambda s, r: (s, r[:, :24].contiguous()),
     "grouped_gemm_kn: addend_rows.shape = [4, 24] breaks the rule: must be (num_experts, n_out) = (4, 32)"),
    ("rows contiguity", lambda s, r: (s, r.t().contiguous().t()),
     "grouped_gemm_kn: addend_rows.stride() = [1, 4] breaks the rule: must be contiguous"),
    ("device", lambda s, r: (s, r), "grouped_gemm_kn: a.device = cpu breaks the rule: must be a CUDA device"),
]


@pytest.mark.parametrize("name,mutate,message", KN_ADDEND_CASES, ids=[c[0] for c in KN_ADDEND_CASES])
def test_grouped_gemm_kn_rejects_a_bad_addend(name, mutate, message):
    a, b, offs, scale, rows = valid_kn_addend()
    with pytest.raises((TypeError, ValueError), match=re.escape(message)):
        torch.ops.sonicmoe.grouped_gemm_kn(a, b, offs, False, 0, *mutate(scale, rows))


def test_grouped_gemm_kn_checks_b_before_the_addend():
    # The addend's rules read b's shape, so b's own rule is reported first (a 2-D b used to raise
    # an index error from the addend's check).
    a, b, offs, scale, rows = valid_kn_addend()
    with pytest.raises(ValueError, match=re.escape("grouped_gemm: b.shape = [4, 64] breaks the rule: must be 3-D")):
        torch.ops.sonicmoe.grouped_gemm_kn(a, b[:, :, 0].contiguous(), offs, False, 0, scale, rows)


def test_grouped_gemm_kn_addend_fake_shape_without_a_gpu():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a, b, offs = torch.empty(1000, 256, dtype=torch.bfloat16), torch.empty(8, 256, 1536, dtype=torch.bfloat16), \
            torch.empty(9, dtype=torch.int32)
        out = torch.ops.sonicmoe.grouped_gemm_kn(a, b, offs, False, 0, torch.empty(1000),
                                                 torch.empty(8, 1536, dtype=torch.bfloat16))
    assert out.shape == (1000, 1536) and out.dtype == torch.bfloat16


def test_kernel_archs_name_the_build():
    # 90: sm_90a kernels, 100: sm_100a; what SONICMOE_CUDA_ARCHS built.
    archs = sonicmoe.kernel_archs()
    assert archs and set(archs) <= {90, 100} and list(archs) == sorted(set(archs))
    assert archs == tuple(torch.ops.sonicmoe.kernel_archs())
