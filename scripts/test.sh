#!/usr/bin/env bash
# The whole test suite, against the installed wheel: sets up the virtual environment
# (scripts/setup.sh --deps-only), builds the wheel (the kernel library, the extension), installs it
# there, checks every kernel unit's SASS (scripts/check_sass.sh), builds and runs the GoogleTest
# suite (ctest), then pytest on the installed package. GPU tests skip with a reason where there is
# no Hopper GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --deps-only
PY=${VIRTUAL_ENV:-${SONICMOE_VENV:-.venv}}/bin/python
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export PATH="$(dirname "$PY"):$CUDA_HOME/bin:$PATH"

echo "== building the wheel (archs: ${SONICMOE_CUDA_ARCHS:-90a;100a}, jobs: ${MAX_JOBS:-$(nproc)})"
rm -rf dist
"$PY" -m pip wheel . --no-build-isolation --no-deps -w dist >build-wheel.log 2>&1 || { tail -n 60 build-wheel.log; exit 1; }
wheel=$(ls dist/sonicmoe-*.whl)
echo "   built $wheel"
"$PY" -m pip install --quiet --disable-pip-version-check --no-deps --force-reinstall "$wheel"

echo "== SASS check of the kernel units (scripts/check_sass.sh)"
PYTHON="$PY" bash scripts/check_sass.sh build/cmake

if grep -q "sonicmoe_gtest" build/cmake/build.ninja 2>/dev/null; then
  echo "== GoogleTest suite"
  cmake --build build/cmake --target sonicmoe_gtest -j "${MAX_JOBS:-$(nproc)}" >build-gtest.log 2>&1 \
    || { tail -n 60 build-gtest.log; exit 1; }
  ctest --test-dir build/cmake --output-on-failure
else
  echo "== GoogleTest not found: the gtest suite is not built (install libgtest-dev)"
fi

echo "== pytest (the installed $("$PY" -c 'import sonicmoe; print(sonicmoe.__version__)'))"
SONICMOE_TEST_INSTALLED=1 "$PY" -m pytest tests/python -q -rs -p no:cacheprovider
