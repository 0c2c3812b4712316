#!/usr/bin/env bash
# Builds the torch-free kernel library (libsonicmoe_kernels.a) here, on a CPU machine, for the tree
# as it is and for the tree with each kernel-only change, so a GPU machine links them instead
# of compiling CUTLASS units (setup.py's SONICMOE_PREBUILT_KERNELS; scripts/ab_variants.sh takes a
# .a as a change and BASE_KERNELS for the base). Same nvcc, same archs as the GPU machine's build.
#
#   bash scripts/prebuild_kernels.sh my_change.diff ...
#   -> build/prebuilt/base/libsonicmoe_kernels.a, build/prebuilt/k4_smem_h_slices/libsonicmoe_kernels.a
#
# A change is a patch (git apply) or a folder of changed files at their tree paths, as for
# ab_variants.sh. The tree is left as it was; the files a change touched get a new mtime, so the
# next incremental build recompiles what they feed.
set -euo pipefail
cd "$(dirname "$0")/.."
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
JOBS=${MAX_JOBS:-$(nproc)}
OUT=build/prebuilt

python3 scripts/fetch_cutlass.py
cmake -S . -B build/cmake -G Ninja -DSONICMOE_CUDA_ARCHS="${SONICMOE_CUDA_ARCHS:-90a;100a}" \
  -DCMAKE_CUDA_COMPILER="$CUDA_HOME/bin/nvcc" > /dev/null

build() {  # build NAME: the kernel library of the tree as it is now, kept as $OUT/NAME/
  local t=$SECONDS
  cmake --build build/cmake --target sonicmoe_kernels -j "$JOBS" > "build/prebuild-$1.log" 2>&1 ||
    { tail -n 30 "build/prebuild-$1.log"; return 1; }
  mkdir -p "$OUT/$1"
  cp build/cmake/libsonicmoe_kernels.a "$OUT/$1/"
  bash scripts/kernel_sources_digest.sh > "$OUT/$1/csrc.md5"  # what it was built from: check before linking
  echo "== $1: $(grep -c 'Building CUDA' "build/prebuild-$1.log" || true) kernel units, $((SECONDS - t)) s"
}

change_stage=$(mktemp -d)
source scripts/apply_change.sh
applied=""
restore() {
  if [ -n "$applied" ]; then
    apply_change "$applied" revert
    for f in $(changed_files "$applied"); do [ ! -e "$f" ] || touch "$f"; done  # a file the change added is gone
  fi
}
trap restore EXIT

build base
for change in "$@"; do
  change=$(realpath "$change")
  name=$(basename "${change%.diff}")
  apply_change "$change" apply
  applied=$change
  build "$name"
  restore
  applied=""
done
build base > /dev/null  # the library of the tree as it is, for the next local build
ls -la "$OUT"/*/libsonicmoe_kernels.a
