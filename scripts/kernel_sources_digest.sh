#!/usr/bin/env bash
# Prints one md5 over the kernel library's sources: csrc/ without the torch layer (csrc/torch/ is
# compiled wherever the extension is built). prebuild_kernels.sh writes it beside each prebuilt
# libsonicmoe_kernels.a (csrc.md5); a device script compares it before linking one. Needs no .git
# (a GPU machine's copy of the tree has none).
cd "$(dirname "$0")/.."
find csrc -type f -not -path 'csrc/torch/*' | LC_ALL=C sort | xargs md5sum | md5sum | cut -c1-32
