"""Builds sonicmoe._C: CMake compiles the torch-free kernel library (each kernel unit once),
then the thin torch layer (csrc/torch/) links it.

The extension links against the torch of the interpreter that runs the build: build with
`pip wheel . --no-build-isolation` (or `pip install . --no-build-isolation`) in the environment
that will run it. Under pip's default build isolation the build's torch is a fresh download, whose
version need not be the one you run. The wheel's version carries what it was built for:
0.2.0+cu130torch2.14sm90a.sm100a (CUDA, torch, kernel archs; ...sm90a for "90a");
python/sonicmoe/version.py holds the base.

Environment:
  SONICMOE_CUDA_ARCHS  arch list for the kernels: "90a;100a" (default), "90a" or "100a" (also
                       comma-separated).
                       Passed to CMake, which refuses any other arch; the wheel's label names it
  MAX_JOBS             parallel compile jobs (default: all cores)
  CUDA_HOME            defaults to /usr/local/cuda (torch would otherwise guess /usr/local)
  SONICMOE_PREBUILT_KERNELS
                       a libsonicmoe_kernels.a that CMake built elsewhere from the same sources
                       (same CUDA, same archs): no CMake step, only the torch layer is compiled
                       and linked against it (a GPU machine's minutes go to running, not to
                       compiling CUTLASS units a CPU machine can compile)
"""

import os
import pathlib
import re
import subprocess
import sys

os.environ.setdefault("CUDA_HOME", "/usr/local/cuda")

import torch  # noqa: E402
from setuptools import find_packages, setup  # noqa: E402
from setuptools.command.build_py import build_py  # noqa: E402
from torch.utils.cpp_extension import BuildExtension, CUDAExtension  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent
CMAKE_BUILD_DIR = ROOT / "build" / "cmake"
PREBUILT_KERNELS = os.environ.get("SONICMOE_PREBUILT_KERNELS")
KERNELS_LIBRARY = pathlib.Path(PREBUILT_KERNELS).resolve() if PREBUILT_KERNELS else CMAKE_BUILD_DIR / "libsonicmoe_kernels.a"
ARCHS = os.environ.get("SONICMOE_CUDA_ARCHS", "90a;100a")
JOBS = os.environ.get("MAX_JOBS", str(os.cpu_count() or 1))


def build_version():
    """The base version (python/sonicmoe/version.py) with what this build is for as its local
    label: CUDA, torch (major.minor) and the kernel archs."""
    base = re.search(r'__version__ = "([^"]+)"', (ROOT / "python" / "sonicmoe" / "version.py").read_text())[1]
    cuda = (torch.version.cuda or "").replace(".", "")
    torch_mm = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    archs = ".".join("sm" + a for a in ARCHS.replace(",", ";").split(";") if a)
    info = {"cuda": torch.version.cuda, "torch": torch.__version__, "archs": ARCHS}
    if "sdist" in sys.argv:  # sources are built for nothing yet
        return base, info
    return f"{base}+cu{cuda}torch{torch_mm}{archs}", info


VERSION, BUILD_INFO = build_version()


class BuildPyWithBuildInfo(build_py):
    """Writes sonicmoe/_build_info.py into the built package: the wheel's version and what it was
    built for, read by sonicmoe.__version__ / sonicmoe.build_info() (an in-place build has none)."""

    def run(self):
        super().run()
        target = pathlib.Path(self.build_lib) / "sonicmoe" / "_build_info.py"
        target.write_text(f"VERSION = {VERSION!r}\nBUILD_INFO = {BUILD_INFO!r}\n")


class CMakeKernelsThenExtension(BuildExtension):
    def run(self):
        if PREBUILT_KERNELS:
            if not KERNELS_LIBRARY.is_file():
                sys.exit(f"SONICMOE_PREBUILT_KERNELS = {PREBUILT_KERNELS}: no such file")
            return super().run()
        subprocess.check_call([sys.executable, str(ROOT / "scripts" / "fetch_cutlass.py")])
        nvcc = pathlib.Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc"
        has_tests = "ON" if (ROOT / "tests" / "cpp").is_dir() else "OFF"  # an sdist carries no tests
        subprocess.check_call([
            "cmake", "-S", str(ROOT), "-B", str(CMAKE_BUILD_DIR), "-G", "Ninja",
            f"-DSONICMOE_CUDA_ARCHS={ARCHS}", f"-DCMAKE_CUDA_COMPILER={nvcc}", f"-DSONICMOE_BUILD_TESTS={has_tests}",
        ])
        subprocess.check_call([
            "cmake", "--build", str(CMAKE_BUILD_DIR), "--target", "sonicmoe_kernels", "-j", JOBS,
        ])
        super().run()


extension = CUDAExtension(
    name="sonicmoe._C",
    sources=["csrc/torch/bindings.cpp", "csrc/torch/combine.cpp", "csrc/torch/down_proj_grad.cpp",
             "csrc/torch/grouped_gemm.cpp", "csrc/torch/routing.cpp", "csrc/torch/up_proj.cpp",
             "csrc/torch/token_rounding.cpp", "csrc/torch/weight_grad.cpp"],
    include_dirs=[str(ROOT / "csrc")],
    extra_objects=[str(KERNELS_LIBRARY)],
    extra_compile_args={"cxx": ["-O2"]},
)

setup(
    version=VERSION,
    package_dir={"": "python"},
    packages=find_packages("python"),
    ext_modules=[extension],
    cmdclass={"build_ext": CMakeKernelsThenExtension, "build_py": BuildPyWithBuildInfo},
)
