#!/usr/bin/env bash
# Nsight Compute's per-instruction view of the kernels one bench.py part launches (one profiled
# call; bench.py --profile brackets it): warp stall samples and execution counts per SASS
# instruction, summarised by scripts/ncu_stalls.py (where a kernel's samples go, and how many
# instructions a warp issues per loop pass). On the H200; the clocks are left alone, as for every
# timing. Writes $OUT/ncu-source-PART-CONFIG.{ncu-rep,csv}.
#   bash scripts/ncu_source.sh backward_kernels K7_co_m256 olmoe-1b-7b
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: $0 OP PART [CONFIG]" >&2; exit 2; }
op=$1 part=$2 config=${3:-qwen3-30b-a3b}
OUT=${OUT:-ncu-out}
mkdir -p "$OUT"
report="$OUT/ncu-source-$part-$config"
ncu --clock-control none --profile-from-start off -f -o "$report" \
  --section WarpStateStats --section SourceCounters --section InstructionStats \
  python3 benchmarks/bench.py --out "$OUT/bench" --ops "$op" --parts "$part" --configs "$config" --profile
ncu --import "$report.ncu-rep" --page source --csv --print-source sass >"$report.csv"
python3 scripts/ncu_stalls.py "$report.csv"
