#!/usr/bin/env bash
# The whole test suite: sets up, builds the kernels and the extension, then runs the GoogleTest
# suite (ctest) and pytest. GPU tests skip with a reason where there is no Hopper GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY=${PYTHON:-python3}

if grep -q "sonicmoe_gtest" build/cmake/build.ninja 2>/dev/null; then
  echo "== GoogleTest suite"
  cmake --build build/cmake --target sonicmoe_gtest -j "${MAX_JOBS:-$(nproc)}" >build-gtest.log 2>&1 \
    || { tail -n 60 build-gtest.log; exit 1; }
  ctest --test-dir build/cmake --output-on-failure
else
  echo "== GoogleTest not found: the gtest suite is not built (install libgtest-dev)"
fi

echo "== pytest"
"$PY" -m pytest tests/python -q -rs -p no:cacheprovider
