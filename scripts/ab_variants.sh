#!/usr/bin/env bash
# A/B/C... of several changes in one run (on the H200): builds the tree as it is (base) and the
# tree with each change once, keeping each build's extension, then runs COMMAND for every
# variant in turn, ROUNDS times (default 2), swapping the extension in between. Each variant is
# built once however many rounds run (scripts/ab_patch.sh rebuilds both sides every round), so
# more rounds fit in a device call, and alternating them shows the spread within the run.
# Leaves the tree and the extension as it found them, unless it is killed (a device call's time
# limit): then the extension and the build's objects may be the last variant's while the sources
# are the base's, and an incremental build keeps them (their mtimes are newer): touch the changed
# files first.
#
# A change is a patch (applied with git apply, or patch -p1), a folder holding changed files
# at their paths in the tree (scripts/ab_patch.sh --files writes one from a patch), or a prebuilt
# kernel library (a .a: libsonicmoe_kernels.a built by CMake on a CPU machine from the tree with a
# kernel-only change; the variant only links it, see setup.py's SONICMOE_PREBUILT_KERNELS). With
# BASE_KERNELS=path/to/libsonicmoe_kernels.a the base links that one too, so no CUTLASS unit is
# compiled here at all (scripts/prebuild_kernels.sh writes them):
#   bash scripts/ab_variants.sh "python3 benchmarks/bench.py --ops backward_kernels --parts K4_down_proj_grad" \
#     change_a.diff change_b.diff
set -euo pipefail
cd "$(dirname "$0")/.."

[ $# -ge 2 ] || { echo "usage: $0 COMMAND CHANGE..." >&2; exit 2; }
command=$1
shift
stage=$(mktemp -d)
extension() { ls python/sonicmoe/_C*.so 2>/dev/null | head -1 || true; }  # none yet on a fresh machine
original=$(extension)
[ -n "$original" ] && cp "$original" "$stage/original.so"

change_stage=$stage
source scripts/apply_change.sh

build() {  # build NAME [KERNELS]: builds the tree (linking the prebuilt KERNELS if given), keeps its extension as NAME.so
  local kernels=${2:-}
  rm -f python/sonicmoe/_C*.so  # setuptools need not relink for a new kernel library alone: always link
  if SONICMOE_PREBUILT_KERNELS=$kernels MAX_JOBS=${MAX_JOBS:-$(nproc)} \
      python3 setup.py build_ext --inplace >"ab-build-$1.log" 2>&1; then
    echo "== built $1 ($(grep -c 'Building CUDA' "ab-build-$1.log" || true) kernel units)"
    cp "$(extension)" "$stage/$1.so"
  else
    tail -n 30 "ab-build-$1.log"; return 1
  fi
}

applied=""
restore() {
  if [ -n "$applied" ]; then apply_change "$applied" revert; fi
  if [ -f "$stage/original.so" ]; then cp "$stage/original.so" "$(extension)"; fi
  rm -rf "$stage"
}
trap restore EXIT

names=(base)
build base "$([ -n "${BASE_KERNELS:-}" ] && realpath "$BASE_KERNELS")"
i=0
for change in "$@"; do
  i=$((i + 1))
  change=$(realpath "$change")
  if [ "${change%.a}" != "$change" ]; then  # a prebuilt kernel library: link it, change nothing
    name="v$i-$(basename "$(dirname "$change")")"
    build "$name" "$change"
    names+=("$name")
    continue
  fi
  name="v$i-$(basename "${change%.diff}")"
  apply_change "$change" apply
  applied=$change
  build "$name"
  apply_change "$change" revert
  applied=""
  names+=("$name")
done

target=$(extension)
for round in $(seq "${ROUNDS:-2}"); do
  for name in "${names[@]}"; do
    cp "$stage/$name.so" "$target"
    echo "== round $round: $name"
    AB_VARIANT=$name bash -c "$command"  # the command may tell the variants apart (e.g. skip a probe's tests)
  done
done
