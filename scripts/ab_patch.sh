#!/usr/bin/env bash
# A/B of a change in one run (on the H200): alternates builds of the tree as it is (base) and of
# the tree with a change (patched), ROUNDS times (default 2), running COMMAND after each build,
# and leaves the tree as it found it. Runs on different machine starts differ by several percent
# (docs/perf-notes.md, session 8), so a kernel change is judged only against its base in the same
# run, and alternating rounds show the spread within it.
#
# The change is a patch (applied with git apply, or patch -p1), or a folder holding the changed
# files at their paths in the tree, for a machine with neither tool; --files writes that folder:
#   bash scripts/ab_patch.sh --files experiments/k4_lean_epilogue.diff .carry/k4     # here
#   bash scripts/ab_patch.sh .carry/k4 \
#     "python3 benchmarks/bench.py --ops backward_kernels --parts K4_down_proj_grad,K6_grouped_gemm_kn --configs qwen3-30b-a3b"
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = --files ]; then  # --files PATCH DIR: the patched copies of the files PATCH touches
  [ $# -eq 3 ] || { echo "usage: $0 --files PATCH DIR" >&2; exit 2; }
  patch_file=$(realpath "$2")
  stage=$(mktemp -d)
  git apply --numstat "$patch_file" | awk '{print $3}' | while read -r f; do
    mkdir -p "$stage/$(dirname "$f")" && cp "$f" "$stage/$f"
  done
  (cd "$stage" && git apply "$patch_file")
  mkdir -p "$3" && cp -r "$stage"/. "$3"/ && rm -rf "$stage"
  echo "patched files under $3:"; (cd "$3" && find . -type f | sed 's#^\./##')
  exit 0
fi

[ $# -eq 2 ] || { echo "usage: $0 PATCH|DIR COMMAND" >&2; exit 2; }
change=$(realpath "$1")
command=$2
saved=$(mktemp -d)
if [ -d "$change" ]; then
  files=$(cd "$change" && find . -type f | sed 's#^\./##')
  for f in $files; do mkdir -p "$saved/$(dirname "$f")"; cp "$f" "$saved/$f"; done
  apply() { cp -r "$change"/. .; }
  revert() { cp -r "$saved"/. .; }
elif command -v git >/dev/null; then
  git apply --check "$change"
  apply() { git apply "$change"; }
  revert() { git apply -R "$change"; }
elif command -v patch >/dev/null; then
  patch -p1 --dry-run -s <"$change" >/dev/null
  apply() { patch -p1 -s <"$change"; }
  revert() { patch -p1 -R -s <"$change"; }
else
  echo "$0: neither git nor patch here: pass a folder written by --files" >&2; exit 2
fi
applied=0
trap 'if [ "$applied" = 1 ]; then revert; fi; rm -rf "$saved"' EXIT
for round in $(seq "${ROUNDS:-2}"); do
  for variant in base patched; do
    if [ "$variant" = patched ]; then apply; applied=1; fi
    if MAX_JOBS=${MAX_JOBS:-$(nproc)} python3 setup.py build_ext --inplace >"ab-build-$variant.log" 2>&1; then
      echo "== round $round: $variant ($(grep -c 'Building CUDA' "ab-build-$variant.log" || true) kernel units rebuilt)"
      bash -c "$command"
    else
      tail -n 30 "ab-build-$variant.log"; exit 1
    fi
    if [ "$variant" = patched ]; then revert; applied=0; fi
  done
done
