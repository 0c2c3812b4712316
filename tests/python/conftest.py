"""Test setup: import sonicmoe, and the skip conditions shared by the GPU tests.

SONICMOE_TEST_INSTALLED=1 (scripts/test.sh) tests the installed package, the wheel, and refuses
to run on the source tree; otherwise sonicmoe comes from python/ (build the extension in place
first: python setup.py build_ext --inplace)."""

import json
import os
import pathlib
import sys

import pytest
import torch

_ROOT = pathlib.Path(__file__).resolve().parents[2]
if os.environ.get("SONICMOE_TEST_INSTALLED") != "1":
    sys.path.insert(0, str(_ROOT / "python"))

import sonicmoe  # noqa: E402

if os.environ.get("SONICMOE_TEST_INSTALLED") == "1" and (_ROOT / "python") in pathlib.Path(sonicmoe.__file__).parents:
    raise RuntimeError(f"SONICMOE_TEST_INSTALLED=1 but sonicmoe was imported from the source tree ({sonicmoe.__file__})")

_ANCHORS = _ROOT / "benchmarks" / "anchors" / "h200-2026-11-29.json"
# The anchor configs (benchmarks/anchors): name -> dict(T, d, n, E, K).
ANCHOR_CONFIGS = {}
for _row in json.loads(_ANCHORS.read_text())["rows"]:
    ANCHOR_CONFIGS.setdefault(_row["config"], {k: _row[k] for k in ("T", "d", "n", "E", "K")})


def _hopper_reason():
    if not sonicmoe.extension_available():
        return "sonicmoe._C is not built (python setup.py build_ext --inplace)"
    if not torch.cuda.is_available():
        return "needs a CUDA GPU (none here)"
    if torch.cuda.get_device_capability() != (9, 0):
        return f"needs a Hopper sm_90 GPU, found sm_{''.join(map(str, torch.cuda.get_device_capability()))}"
    return None


HOPPER_SKIP_REASON = _hopper_reason()
requires_hopper = pytest.mark.skipif(HOPPER_SKIP_REASON is not None, reason=HOPPER_SKIP_REASON or "")


def _blackwell_reason():
    """A B200 / GB200 (compute capability 10.0: the one sm_100a loads on) and a build holding
    sm_100a kernels (SONICMOE_CUDA_ARCHS="90a;100a")."""
    if not sonicmoe.extension_available():
        return "sonicmoe._C is not built (python setup.py build_ext --inplace)"
    if not torch.cuda.is_available():
        return "needs a CUDA GPU (none here)"
    if torch.cuda.get_device_capability() != (10, 0):
        return f"needs a Blackwell sm_100 GPU, found sm_{''.join(map(str, torch.cuda.get_device_capability()))}"
    if 100 not in sonicmoe.kernel_archs():
        return f"this build holds no sm_100a kernels (kernel_archs {sonicmoe.kernel_archs()}): rebuild with " \
               'SONICMOE_CUDA_ARCHS="90a;100a"'
    return None


BLACKWELL_SKIP_REASON = _blackwell_reason()
requires_blackwell = pytest.mark.skipif(BLACKWELL_SKIP_REASON is not None, reason=BLACKWELL_SKIP_REASON or "")
ON_BLACKWELL = BLACKWELL_SKIP_REASON is None
# The GPUs the layer runs on: a Hopper, or a Blackwell with a build holding sm_100a kernels.
KERNEL_GPU_SKIP_REASON = None if ON_BLACKWELL else HOPPER_SKIP_REASON
requires_kernel_gpu = pytest.mark.skipif(KERNEL_GPU_SKIP_REASON is not None, reason=KERNEL_GPU_SKIP_REASON or "")

requires_extension = pytest.mark.skipif(
    not sonicmoe.extension_available(),
    reason="sonicmoe._C is not built (python setup.py build_ext --inplace)",
)


@pytest.fixture
def fp32_matmul_reference():
    """fp32 references computed with true fp32 matmuls (no TF32 rounding)."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = old
