#!/usr/bin/env bash
# Nsight Compute on parts of bench.py's per-kernel tables, one profiled call each (bench.py
# --profile brackets it with cudaProfilerStart / Stop; setup, warm-up and the other parts stay
# outside): speed of light, memory workload (L1, L2 and DRAM throughput), compute workload, warp
# states and source counters of every kernel those calls launch. On the H200 (ncu there reads
# the counters with --clock-control none: the clocks are left alone, as for every timing).
# Writes $OUT/ncu-OP-CONFIG.ncu-rep and a text copy of its details page beside it.
#   bash scripts/ncu_parts.sh backward_kernels K4_down_proj_grad,K6_grouped_gemm_kn qwen3-30b-a3b
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: $0 OP PARTS [CONFIG]" >&2; exit 2; }
op=$1 parts=$2 config=${3:-qwen3-30b-a3b}
OUT=${OUT:-ncu-out}
mkdir -p "$OUT"
report="$OUT/ncu-$op-$config"
ncu --clock-control none --profile-from-start off -f -o "$report" \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
  --section WarpStateStats --section LaunchStats --section Occupancy --section SourceCounters \
  python3 benchmarks/bench.py --out "$OUT/bench" --ops "$op" --parts "$parts" --configs "$config" --profile
ncu --import "$report.ncu-rep" --page details >"$report.txt"
grep -E "^  [a-z_]|Duration|Memory Throughput|L1/TEX Cache Throughput|L2 Cache Throughput|DRAM Throughput|Compute \(SM\) Throughput|Executed Ipc Active|Registers Per Thread" \
  "$report.txt" | cut -c1-140 || true
