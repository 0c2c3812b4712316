#!/usr/bin/env bash
# A/B of a change in one run (on the H200): scripts/ab_variants.sh with one change. It builds the
# tree as it is (base) and the tree with the change once each, then runs COMMAND with each build's
# extension in turn, ROUNDS times (default 2), and leaves the tree as it found it. Two starts of the
# same card differ by several percent, so a kernel change is judged only against its base in the
# same run, and alternating rounds show the spread
# within it.
#
# The change is a patch (applied with git apply, or patch -p1), or a folder holding the changed
# files at their paths in the tree, for a machine with neither tool; --files writes that folder:
#   bash scripts/ab_patch.sh --files my_change.diff .carry/k4     # here
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
exec bash scripts/ab_variants.sh "$2" "$1"
