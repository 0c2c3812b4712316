#!/usr/bin/env bash
# A/B of a change in one run (on the H200): alternates builds of the tree as it is (base) and of
# the tree with PATCH applied (patched), ROUNDS times (default 2), running COMMAND after each
# build, and leaves the tree as it found it. Runs on different machine starts differ by several
# percent (docs/perf-notes.md, session 8), so a kernel change is judged only against its base in
# the same run, and alternating rounds show the spread within it.
#   git diff main wip/branch -- csrc > change.diff
#   bash scripts/ab_patch.sh change.diff \
#     "python3 benchmarks/bench.py --ops backward_kernels --parts K4_down_proj_grad,K6_grouped_gemm_kn --configs qwen3-30b-a3b"
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 2 ] || { echo "usage: $0 PATCH COMMAND" >&2; exit 2; }
patch_file=$(realpath "$1")
command=$2
git apply --check "$patch_file"
applied=0
restore() { if [ "$applied" = 1 ]; then git apply -R "$patch_file"; fi; }
trap restore EXIT
for round in $(seq "${ROUNDS:-2}"); do
  for variant in base patched; do
    if [ "$variant" = patched ]; then git apply "$patch_file"; applied=1; fi
    if MAX_JOBS=${MAX_JOBS:-$(nproc)} python3 setup.py build_ext --inplace >"ab-build-$variant.log" 2>&1; then
      echo "== round $round: $variant ($(grep -c 'Building CUDA' "ab-build-$variant.log" || true) kernel units rebuilt)"
      bash -c "$command"
    else
      tail -n 30 "ab-build-$variant.log"; exit 1
    fi
    if [ "$variant" = patched ]; then git apply -R "$patch_file"; applied=0; fi
  done
done
