#!/usr/bin/env bash
# SASS check of the kernel library: every arch-specific kernel unit holds the tensor-core and TMA
# instructions it was written for, compiled for its own arch.
#   *_sm100.cu: a cubin for sm_100a with tcgen05 MMA (UTC*MMA: UTCHMMA for bf16, UTCQMMA for fp8,
#               ...) and TMA loads (UTMALDG)
#   *_sm90.cu:  a cubin for sm_90a with warpgroup MMA (HGMMA); its k loop's instructions and
#               R2UR are reported (scripts/sass_wgmma_loop.py), not required: an R2UR per WGMMA
#               operand word there is a descriptor built on the vector datapath
# A unit that lost them (a guard that compiled its body out, a fallback to mma.sync, a wrong
# -gencode) compiles and links silently; this catches it without a GPU. Prints a table; exits 1
# on any miss, 2 when nothing was found to check.
#
#   scripts/check_sass.sh [BUILD_DIR | libsonicmoe_kernels.a]     (default: build/cmake)
#
# cuobjdump: $CUOBJDUMP, else $CUDA_HOME/bin (default /usr/local/cuda), else PATH, else the copy
# that Triton's wheel carries (a toolkit without cuobjdump, as on the CPU build machine).
set -euo pipefail
cd "$(dirname "$0")/.."

target=${1:-build/cmake}
find_cuobjdump() {
  local c
  for c in "${CUOBJDUMP:-}" "${CUDA_HOME:-/usr/local/cuda}/bin/cuobjdump" "$(command -v cuobjdump || true)"; do
    [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return; }
  done
  for py in "${PYTHON:-}" .venv/bin/python python3; do
    [ -n "$py" ] && command -v "$py" >/dev/null || continue
    c=$("$py" -c 'import os, triton; print(os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump"))' 2>/dev/null || true)
    [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return; }
  done
}
CUOBJDUMP=$(find_cuobjdump)
[ -n "$CUOBJDUMP" ] || { echo "check_sass: no cuobjdump (set CUOBJDUMP=/path/to/cuobjdump)" >&2; exit 2; }

# The objects: the kernel units of a CMake build dir, or the members of the static library.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -f "$target" ]; then
  library=$(realpath "$target")  # before the cd, so that a relative path still resolves
  (cd "$work" && ar x "$library")
  objdir=$work
elif [ -d "$target" ]; then
  objdir=$target
else
  echo "check_sass: $target is neither a build dir nor a library" >&2; exit 2
fi
mapfile -t objects < <(find "$objdir" -name '*_sm90.cu.o' -o -name '*_sm100.cu.o' | sort)
[ ${#objects[@]} -gt 0 ] || { echo "check_sass: no *_sm90.cu.o / *_sm100.cu.o under $target" >&2; exit 2; }

# count REGEX FILE: how many SASS instructions match (opcode with its modifiers).
count() { grep -cE "$1" "$2" || true; }
# names REGEX FILE: the distinct opcodes that match, with counts ("UTCHMMA.2CTA:4 ...").
names() { grep -oE "$1" "$2" | sort | uniq -c | awk '{printf "%s%s:%s", (NR>1?" ":""), $2, $1}' || true; }

printf '%-72s %-8s %-8s %-34s %-8s %-16s %s\n' unit arch cubin "MMA (opcode:count)" UTMALDG "k loop (R2UR)" result
misses=0
for obj in "${objects[@]}"; do
  unit=$(basename "$obj" .o)
  case "$unit" in
    *_sm100.cu) arch=sm_100a; mma='\bUTC[A-Z]*MMA[A-Z0-9_.]*'; label="tcgen05 MMA (UTC*MMA)" ;;
    *_sm90.cu) arch=sm_90a; mma='\bHGMMA[A-Z0-9_.]*'; label="HGMMA" ;;
  esac
  sass="$work/$unit.sass"
  "$CUOBJDUMP" -sass "$obj" > "$sass" 2>/dev/null || : > "$sass"
  cubins=$("$CUOBJDUMP" -lelf "$obj" 2>/dev/null | grep -oE 'sm_[0-9]+[af]?\.cubin' | sed 's/\.cubin//' | sort -u | tr '\n' ' ' | sed 's/ $//')
  n_mma=$(count "$mma" "$sass")
  n_tma=$(count '\bUTMALDG' "$sass")
  result=""
  [ "$cubins" = "$arch" ] || result+="MISS: cubin ${cubins:-none}, want $arch only; "
  [ "$n_mma" -gt 0 ] || result+="MISS: no $label; "
  # TMA loads are required of the sm100 units (their mainloop is TMA-only); the sm90 weight
  # gradients' gathered operand loads by cp.async, so there they are reported, not required.
  if [ "$arch" = sm_100a ] && [ "$n_tma" -eq 0 ]; then result+="MISS: no UTMALDG; "; fi
  # The k loop (the unit's kernel with the most R2UR per HGMMA in it), sm90 only: reported.
  loop=""
  if [ "$arch" = sm_90a ]; then
    read -r _ loop_instructions loop_r2ur _ < <("${PYTHON:-python3}" scripts/sass_wgmma_loop.py "$sass" | tail -n 1)
    loop="$loop_instructions ($loop_r2ur)"
  fi
  result=${result%; }
  result=${result:-ok}
  [ "$result" = ok ] || misses=$((misses + 1))
  mma_names=$(names "$mma" "$sass")
  printf '%-72s %-8s %-8s %-34s %-8s %-16s %s\n' "$unit" "$arch" "$cubins" "${mma_names:-none}" "$n_tma" "${loop:--}" "$result"
done
echo "checked ${#objects[@]} units with $CUOBJDUMP: $misses miss(es)"
[ "$misses" -eq 0 ]
