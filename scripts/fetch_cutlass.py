#!/usr/bin/env python3
"""Fill third_party/cutlass/ with the CUTLASS headers of the pinned nvidia-cutlass wheel.

Idempotent: a stamp file records the version; a matching stamp means nothing to do.
No CUTLASS file is ever committed (third_party/cutlass/ is git-ignored).
"""
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile

CUTLASS_WHEEL = "nvidia-cutlass==4.2.0.0"
# Wheel-internal prefixes -> destination under third_party/cutlass/.
COPIES = {
    "cutlass_library/source/include/": "include/",
    "cutlass_library/source/tools/util/include/": "tools/util/include/",
}

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEST = ROOT / "third_party" / "cutlass"
STAMP = DEST / ".wheel-version"


def main() -> int:
    if STAMP.exists() and STAMP.read_text().strip() == CUTLASS_WHEEL:
        print(f"third_party/cutlass: {CUTLASS_WHEEL} already in place")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.check_call(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--only-binary=:all:", "--dest", tmp, CUTLASS_WHEEL])
        wheels = list(pathlib.Path(tmp).glob("nvidia_cutlass-*.whl"))
        if len(wheels) != 1:
            print(f"expected one nvidia_cutlass wheel in {tmp}, found {wheels}", file=sys.stderr)
            return 1
        if DEST.exists():
            shutil.rmtree(DEST)
        count = 0
        with zipfile.ZipFile(wheels[0]) as wheel:
            for name in wheel.namelist():
                for prefix, target in COPIES.items():
                    if name.startswith(prefix) and not name.endswith("/"):
                        out = DEST / target / name[len(prefix):]
                        out.parent.mkdir(parents=True, exist_ok=True)
                        out.write_bytes(wheel.read(name))
                        count += 1
    if not (DEST / "include" / "cutlass" / "cutlass.h").exists():
        print("third_party/cutlass: cutlass/cutlass.h missing after extraction", file=sys.stderr)
        return 1
    STAMP.write_text(CUTLASS_WHEEL + "\n")
    print(f"third_party/cutlass: extracted {count} files from {CUTLASS_WHEEL}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
