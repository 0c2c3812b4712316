#!/usr/bin/env bash
# Installs what the build and tests need (when missing) and builds sonicmoe._C in place.
# Used by scripts/test.sh and scripts/demo.sh; safe to run again (everything is incremental).
set -euo pipefail
cd "$(dirname "$0")/.."
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export PATH="$CUDA_HOME/bin:$PATH"
PY=${PYTHON:-python3}

pip_install() { "$PY" -m pip install --quiet --disable-pip-version-check "$@"; }

if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "== installing torch 2.14.1 (CUDA 13.0 build)"
  pip_install torch==2.14.1
fi
"$PY" -c "import pytest" 2>/dev/null || pip_install pytest
command -v ninja >/dev/null || pip_install ninja
command -v cmake >/dev/null || pip_install cmake
if ! [ -f /usr/include/gtest/gtest.h ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  echo "== installing GoogleTest (libgtest-dev)"
  apt-get update -qq >/dev/null && apt-get install -y -qq libgtest-dev >/dev/null
fi
command -v nvcc >/dev/null || { echo "nvcc not found: set CUDA_HOME to a CUDA 13 toolkit" >&2; exit 1; }

echo "== building sonicmoe._C (archs: ${SONICMOE_CUDA_ARCHS:-90a}, jobs: ${MAX_JOBS:-$(nproc)})"
"$PY" setup.py build_ext --inplace >build-ext.log 2>&1 || { tail -n 60 build-ext.log; exit 1; }
echo "   built $(ls python/sonicmoe/_C*.so)"
