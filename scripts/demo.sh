#!/usr/bin/env bash
# Sets up, builds, and runs the demo (benchmarks/demo.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
"${PYTHON:-python3}" benchmarks/demo.py
