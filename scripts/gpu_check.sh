#!/usr/bin/env bash
# On a Hopper GPU: build the extension, run the GPU pytest suite and the gtest binary, check SASS
# for HGMMA, run the benchmark, and end with a short summary table. Logs go to $OUT (or ./gpu-out).
#   bash scripts/gpu_check.sh             # everything
#   GTEST_BIN=path/to/sonicmoe_gtest ...  # gtest binary built on the CPU machine (no gtest there)
#   BENCH_OPS=moe_forward ... QUALITY=1 ... PYTEST_ARGS=... # narrower benchmark, quality check, pytest args
#   PYTEST_PATHS="tests/python/test_moe.py ..." ... # part of the suite (default tests/python: ~380 s on
#                                        # an H100, most of it in the files before test_moe.py)
#   STEP_TIMEOUT=300 ...                 # seconds per step before it is killed (a hang reads as rc=124)
#   STEPS="gtest pytest bench" ...       # only these steps after the build (default: all above)
#   SONICMOE_PREBUILT_KERNELS=lib.a ...  # link a kernel library built on a CPU machine
#                                        # (scripts/prebuild_kernels.sh), compile no CUTLASS unit here
#   SBS="paper-7b-n256 ..." ...          # also benchmarks/sidebyside.py, one process per config
#                                        # (upstream SonicMoE importable: ../shared/anchors/README.md)
#   NCU_SBS="paper-7b-n256 ..." ...      # also scripts/ncu_parts.sh --sidebyside per config (Nsight
#                                        # Compute on both layers' kernels; reports in $OUT/ncu)
#   NCU_DUR="qwen3-235b-a22b ..." ...    # also ncu_parts.sh --durations per config, both layers
#                                        # (each kernel's duration alone, a table per layer)
#   AB_RULES="qwen3-235b-a22b ..." ...   # also benchmarks/ab_rules.py per config (the backward's
#                                        # rules A/B, timed and at the power cap; AB_VARIANTS="..."
#                                        # its variants, default all)
# compute-sanitizer's memcheck and racecheck run scripts/sanitize_small.py (a small forward + backward).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
GTEST_BIN=${GTEST_BIN:-.carry/sonicmoe_gtest}
STEPS=" ${STEPS:-gtest pytest memcheck racecheck sass bench demo} "
[ -n "${QUALITY:-}" ] && STEPS+="quality "
declare -A result
config_steps=()  # each_config's steps (NAME-CONFIG), in order, for the summary

step() {  # step NAME LOG COMMAND...: runs COMMAND where STEPS lists NAME before any '-' (build: always)
  local name=$1 log=$2; shift 2
  if [ "$name" != build ] && [[ "$STEPS" != *" ${name%%-*} "* ]]; then return; fi
  local t0=$SECONDS
  if timeout "${STEP_TIMEOUT:-900}" "$@" >"$OUT/$log" 2>&1; then result[$name]="ok"; else result[$name]="FAILED (rc=$?)"; fi
  result[$name]="${result[$name]} $((SECONDS - t0))s"
  echo "== $name: ${result[$name]}"; tail -n 3 "$OUT/$log"
}

each_config() {  # each_config NAME "CONFIGS" COMMAND...: step NAME-c for each config c, {} in COMMAND
  local name=$1 configs=$2 c; shift 2
  STEPS+="$name "  # a config list given is a step asked for
  for c in $configs; do
    config_steps+=("$name-$c")
    step "$name-$c" "$name-$c.log" "${@//\{\}/$c}"
  done
}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >"$OUT/gpu.txt" 2>&1
step build build.log env MAX_JOBS=${MAX_JOBS:-16} python3 setup.py build_ext --inplace
{ which c++ g++; c++ --version | head -1; ldd python/sonicmoe/_C*.so | grep -E "stdc|cudart";
  echo "libstdc++ ostream symbols defined inside _C: $(nm -C --defined-only python/sonicmoe/_C*.so | grep -c 'std::basic_ostream')"; } >"$OUT/toolchain.txt" 2>&1
if [ -x "$GTEST_BIN" ]; then
  step gtest gtest.log "$GTEST_BIN"
elif [[ "$STEPS" == *" gtest "* ]]; then
  result[gtest]="not run: no gtest binary at $GTEST_BIN"
fi
step pytest pytest.log python3 -m pytest ${PYTEST_PATHS:-tests/python} -q -rs -p no:cacheprovider --durations=20 \
  ${PYTEST_ARGS:-}
for tool in memcheck racecheck; do  # one small forward + backward, top-K and token rounding
  step $tool $tool.log env PYTHONPATH=python compute-sanitizer --tool $tool --error-exitcode 9 \
    python3 scripts/sanitize_small.py
done

sass_check() {
  local so; so=$(ls python/sonicmoe/_C*.so)
  cuobjdump --dump-sass "$so" >"$OUT/sass.txt" || return 1
  awk '/Function :/ {fn=$3} /HGMMA/ {n[fn]++} END {for (f in n) printf "%6d HGMMA  %s\n", n[f], substr(f,1,120)}' \
    "$OUT/sass.txt" | sort -rn
  [ "$(grep -c HGMMA "$OUT/sass.txt")" -gt 0 ]
}
export OUT; export -f sass_check  # step runs commands under timeout, which needs a program
step sass sass_summary.txt bash -c sass_check
step bench bench.log python3 benchmarks/bench.py --all-tiles --out "$OUT" \
  --ops ${BENCH_OPS:-grouped_gemm,combine,moe_forward,moe_backward}
# token-rounding quality check (two short trainings), with QUALITY=1
step quality quality.log python3 benchmarks/quality_token_rounding.py --out "$OUT/quality"
step demo demo.log python3 benchmarks/demo.py
# One process per config: each prints its table and writes its JSON.
each_config sbs "${SBS:-}" env OUT="$OUT/sbs-{}" python3 benchmarks/sidebyside.py {}
each_config ncu "${NCU_SBS:-}" env OUT="$OUT/ncu" bash scripts/ncu_parts.sh --sidebyside {}
each_config ncudur "${NCU_DUR:-}" env IMPLS=project,upstream OUT="$OUT/ncu" bash scripts/ncu_parts.sh --durations {}
each_config abrules "${AB_RULES:-}" python3 benchmarks/ab_rules.py {} ${AB_VARIANTS:-}

echo
echo "== summary ($(head -2 "$OUT/gpu.txt" | tail -1))"
printf '%-8s %s\n' step result
for s in build gtest pytest memcheck racecheck sass bench demo quality; do printf '%-8s %s\n' "$s" "${result[$s]:-not run}"; done
for k in "${config_steps[@]}"; do printf '%-8s %s\n' "${k%%-*} ${k#*-}" "${result[$k]:-not run}"; done
grep -E "passed|failed" "$OUT/pytest.log" 2>/dev/null | tail -1
grep -E "PASSED|FAILED|SKIPPED" "$OUT/gtest.log" 2>/dev/null | grep "^\[  " | head -3
grep -h -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/memcheck.log" "$OUT/racecheck.log" 2>/dev/null
cat "$OUT/sass_summary.txt" 2>/dev/null | head -8
[ -f "$OUT/bench.log" ] && sed -n '/^config/,$p' "$OUT/bench.log"
for c in ${SBS:-}; do grep -h -E "^$c |project / " "$OUT/sbs-$c.log" 2>/dev/null || true; done
for c in ${AB_RULES:-}; do sed -n '/^variant/,$p' "$OUT/abrules-$c.log" 2>/dev/null || true; done
