#!/usr/bin/env python3
"""Fill third_party/cutlass/ with the CUTLASS headers of the pinned nvidia-cutlass wheel: from the
installed package where it is (pyproject's build requirement under pip's build isolation), else
from the wheel downloaded by pip.

Idempotent: a stamp file records the version; a matching stamp means nothing to do.
No CUTLASS file is ever committed (third_party/cutlass/ holds only its tracked README).
"""
import importlib.metadata
import importlib.util
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


def clear() -> None:
    """Removes what an earlier extraction left (the tracked README stays)."""
    for target in ("include", "tools", STAMP.name):
        path = DEST / target
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def copy_installed() -> int:
    """Copies the headers from an installed nvidia-cutlass of the pinned version; 0 files if none."""
    try:
        if importlib.metadata.version("nvidia-cutlass") != CUTLASS_WHEEL.split("==")[1]:
            return 0
    except importlib.metadata.PackageNotFoundError:
        return 0
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or not spec.submodule_search_locations:
        return 0
    package = pathlib.Path(list(spec.submodule_search_locations)[0]).parent
    count = 0
    for prefix, target in COPIES.items():
        source = package / prefix
        if not source.is_dir():
            return 0
        for path in source.rglob("*"):
            if path.is_file():
                out = DEST / target / path.relative_to(source)
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, out)
                count += 1
    return count


def main() -> int:
    if STAMP.exists() and STAMP.read_text().strip() == CUTLASS_WHEEL:
        print(f"third_party/cutlass: {CUTLASS_WHEEL} already in place")
        return 0
    clear()
    count = copy_installed()
    if count:
        print(f"third_party/cutlass: copied {count} files from the installed {CUTLASS_WHEEL}")
    else:
        count = extract_downloaded()
    if not (DEST / "include" / "cutlass" / "cutlass.h").exists():
        print("third_party/cutlass: cutlass/cutlass.h missing after extraction", file=sys.stderr)
        return 1
    STAMP.write_text(CUTLASS_WHEEL + "\n")
    return 0


def extract_downloaded() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.check_call(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--only-binary=:all:", "--dest", tmp, CUTLASS_WHEEL])
        wheels = list(pathlib.Path(tmp).glob("nvidia_cutlass-*.whl"))
        if len(wheels) != 1:
            sys.exit(f"expected one nvidia_cutlass wheel in {tmp}, found {wheels}")
        count = 0
        with zipfile.ZipFile(wheels[0]) as wheel:
            for name in wheel.namelist():
                for prefix, target in COPIES.items():
                    if name.startswith(prefix) and not name.endswith("/"):
                        out = DEST / target / name[len(prefix):]
                        out.parent.mkdir(parents=True, exist_ok=True)
                        out.write_bytes(wheel.read(name))
                        count += 1
    print(f"third_party/cutlass: extracted {count} files from {CUTLASS_WHEEL}")
    return count


if __name__ == "__main__":
    sys.exit(main())
