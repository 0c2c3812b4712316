#!/usr/bin/env bash
# Sets up a virtual environment (.venv, or the active one) with what the build and tests need, and
# builds sonicmoe._C in place. --deps-only stops before the build (scripts/test.sh builds a wheel).
# Nothing is installed into the system interpreter. Safe to run again (everything is incremental).
# The venv sees the system's packages (--system-site-packages), so a machine whose torch came with
# it (a GPU image without network access) builds against that torch.
set -euo pipefail
cd "$(dirname "$0")/.."
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export PATH="$CUDA_HOME/bin:$PATH"

if [ -n "${VIRTUAL_ENV:-}" ]; then
  PY=${VIRTUAL_ENV}/bin/python
else
  VENV=${SONICMOE_VENV:-.venv}
  [ -x "$VENV/bin/python" ] || { echo "== creating the virtual environment $VENV"; python3 -m venv --system-site-packages "$VENV"; }
  PY=$VENV/bin/python
fi
pip_install() { "$PY" -m pip install --quiet --disable-pip-version-check "$@"; }

if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "== installing torch 2.14.1 (CUDA 13.0 build)"
  pip_install torch==2.14.1
fi
# The build's tools (pyproject.toml's build requirements) and the tests' packages.
"$PY" -c "import pytest, wheel, ninja, cmake" 2>/dev/null || pip_install pytest wheel ninja cmake "setuptools>=64"
# CUTLASS's headers (scripts/fetch_cutlass.py copies them), unless a prebuilt kernel library is linked.
[ -n "${SONICMOE_PREBUILT_KERNELS:-}" ] || "$PY" -c "import cutlass_library" 2>/dev/null \
  || pip_install --no-deps nvidia-cutlass==4.2.0.0
# Optional: the integration's tests skip without it.
"$PY" -c "import transformers" 2>/dev/null || pip_install "transformers>=5.17,<6" \
  || echo "   transformers not installed: the integration's tests will skip"
export PATH="$(dirname "$PY"):$PATH"  # the venv's cmake and ninja
if ! [ -f /usr/include/gtest/gtest.h ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  echo "== installing GoogleTest (libgtest-dev)"
  apt-get update -qq >/dev/null && apt-get install -y -qq libgtest-dev >/dev/null
fi
command -v nvcc >/dev/null || { echo "nvcc not found: set CUDA_HOME to a CUDA 13 toolkit" >&2; exit 1; }
[ "${1:-}" = "--deps-only" ] && exit 0

echo "== building sonicmoe._C in place (archs: ${SONICMOE_CUDA_ARCHS:-90a;100a}, jobs: ${MAX_JOBS:-$(nproc)})"
"$PY" setup.py build_ext --inplace >build-ext.log 2>&1 &
build=$!
while kill -0 "$build" 2>/dev/null; do  # a progress line from ninja's [done/total] counts
  step=$(grep -o '^\[[0-9]*/[0-9]*\]' build-ext.log 2>/dev/null | tail -n 1 || true)
  [ -t 1 ] && printf '\r   compiling %s ' "${step:-(configuring)}"
  sleep 5
done
[ -t 1 ] && echo
wait "$build" || { tail -n 60 build-ext.log; exit 1; }
echo "   built $(ls python/sonicmoe/_C*.so)"
