# Sourced by ab_variants.sh and prebuild_kernels.sh. A change is a patch (git apply, or patch -p1)
# or a folder holding changed files at their paths in the tree (ab_patch.sh --files writes one).
# The caller sets change_stage to a scratch directory (a folder change's originals wait there).

apply_change() {  # apply_change CHANGE apply|revert
  local change=$1 direction=$2
  if [ -d "$change" ]; then
    if [ "$direction" = apply ]; then
      rm -rf "$change_stage/saved" && mkdir -p "$change_stage/saved"
      (cd "$change" && find . -type f) | while read -r f; do
        mkdir -p "$change_stage/saved/$(dirname "$f")" && cp "$f" "$change_stage/saved/$f"
      done
      cp -r "$change"/. .
    else
      cp -r "$change_stage/saved"/. .
    fi
  elif command -v git >/dev/null; then
    if [ "$direction" = apply ]; then git apply "$change"; else git apply -R "$change"; fi
  elif command -v patch >/dev/null; then
    if [ "$direction" = apply ]; then patch -p1 -s <"$change"; else patch -p1 -R -s <"$change"; fi
  else
    echo "$0: neither git nor patch here: pass a folder written by ab_patch.sh --files" >&2; exit 2
  fi
}

changed_files() {  # the tree paths a change touches
  if [ -d "$1" ]; then (cd "$1" && find . -type f | sed 's|^\./||'); else git apply --numstat "$1" | cut -f3; fi
}
