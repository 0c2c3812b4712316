#!/usr/bin/env bash
# Sets up the virtual environment and builds in place (scripts/setup.sh), then runs the demo
# (benchmarks/demo.py): one training step of the MoE layer against torch._grouped_mm on a Hopper
# GPU, the reference layer on the CPU elsewhere. Arguments go to the demo (e.g. --config olmoe-1b-7b).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
"${VIRTUAL_ENV:-${SONICMOE_VENV:-.venv}}/bin/python" benchmarks/demo.py "$@"
