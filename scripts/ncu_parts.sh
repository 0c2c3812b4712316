#!/usr/bin/env bash
# Nsight Compute on parts of bench.py's per-kernel tables, one profiled call each (bench.py
# --profile brackets it with cudaProfilerStart / Stop; setup, warm-up and the other parts stay
# outside): speed of light, memory workload (L1, L2 and DRAM throughput), compute workload, warp
# states and source counters of every kernel those calls launch. On the H200 (ncu there reads
# the counters with --clock-control none: the clocks are left alone, as for every timing).
# Writes $OUT/ncu-OP-CONFIG.ncu-rep and a text copy of its details page beside it.
#   bash scripts/ncu_parts.sh backward_kernels K4_down_proj_grad,K6_grouped_gemm_kn qwen3-30b-a3b
# With --source first: per-instruction warp stall samples and execution counts instead, as
# $OUT/ncu-source-OP-CONFIG.csv, summarised by scripts/ncu_stalls.py (where each kernel's samples
# go, and how many instructions a warp issues per loop pass).
#   bash scripts/ncu_parts.sh --source backward_kernels K7_co_m256 olmoe-1b-7b
# With --sidebyside CONFIG: every kernel of one forward + backward of this project's layer and of
# upstream SonicMoE's (benchmarks/sidebyside.py with NCU=1; upstream importable as for it), the
# full section set, as $OUT/ncu-sidebyside-CONFIG.ncu-rep, its details page, its raw metrics (csv)
# and its source page (-source.csv: per-instruction counts and stall samples, for ncu_stalls.py)
# beside it, for the kernel-by-kernel comparison (docs/performance.md §4.0).
#   bash scripts/ncu_parts.sh --sidebyside paper-7b-n256
# With --durations CONFIG: only each kernel's duration (one replay a kernel, caches flushed) in one
# forward + backward of each layer in IMPLS (default this project's; one process and one table a
# layer, so each sum is one layer's), printed in launch order by scripts/ncu_durations.py: a
# kernel change's effect per kernel, under scripts/ab_variants.sh.
#   bash scripts/ab_variants.sh "bash scripts/ncu_parts.sh --durations qwen3-30b-a3b" change.diff
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --durations ]; then
  [ $# -ge 2 ] || { echo "usage: $0 --durations CONFIG" >&2; exit 2; }
  IMPLS=${IMPLS:-project}
  for impl in ${IMPLS//,/ }; do
    echo "== $impl, $2"
    NCU=1 IMPLS=$impl OUT=${OUT:-ncu-out}/sidebyside-$2-$impl \
      ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv \
      python3 benchmarks/sidebyside.py "$2" | python3 scripts/ncu_durations.py
  done
  exit
fi
if [ "${1:-}" = --sidebyside ]; then
  [ $# -ge 2 ] || { echo "usage: $0 --sidebyside CONFIG" >&2; exit 2; }
  OUT=${OUT:-ncu-out}
  report="$OUT/ncu-sidebyside-$2"
  mkdir -p "$OUT"
  NCU=1 IMPLS=${IMPLS:-project,upstream} OUT="$OUT/sidebyside-$2" \
    ncu --clock-control none --profile-from-start off -f -o "$report" --set full \
    python3 benchmarks/sidebyside.py "$2"
  ncu --import "$report.ncu-rep" --page details >"$report.txt"
  ncu --import "$report.ncu-rep" --page raw --csv >"$report.csv"
  ncu --import "$report.ncu-rep" --page source --csv --print-source sass >"$report-source.csv"
  exec grep -E "^  [a-zA-Z_]|Duration" "$report.txt"
fi
source=0
if [ "${1:-}" = --source ]; then source=1; shift; fi
[ $# -ge 2 ] || { echo "usage: $0 [--source] OP PARTS [CONFIG]" >&2; exit 2; }
op=$1 parts=$2 config=${3:-qwen3-30b-a3b}
OUT=${OUT:-ncu-out}
mkdir -p "$OUT"
if [ $source = 1 ]; then
  report="$OUT/ncu-source-$op-$config"
  sections=(--section WarpStateStats --section SourceCounters --section InstructionStats)
else
  report="$OUT/ncu-$op-$config"
  sections=(--section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis
            --section WarpStateStats --section LaunchStats --section Occupancy --section SourceCounters)
fi
ncu --clock-control none --profile-from-start off -f -o "$report" "${sections[@]}" \
  python3 benchmarks/bench.py --out "$OUT/bench" --ops "$op" --parts "$parts" --configs "$config" --profile
if [ $source = 1 ]; then
  ncu --import "$report.ncu-rep" --page source --csv --print-source sass >"$report.csv"
  exec python3 scripts/ncu_stalls.py "$report.csv"
fi
ncu --import "$report.ncu-rep" --page details >"$report.txt"
grep -E "^  [a-z_]|Duration|Memory Throughput|L1/TEX Cache Throughput|L2 Cache Throughput|DRAM Throughput|Compute \(SM\) Throughput|Executed Ipc Active|Registers Per Thread" \
  "$report.txt" | cut -c1-140 || true
