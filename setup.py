"""Builds sonicmoe._C: CMake compiles the torch-free kernel library (each kernel unit once),
then the thin torch layer (csrc/torch/) links it.

Environment:
  SONICMOE_CUDA_ARCHS  arch list for the kernels (default "90a"; only Hopper kernels exist yet)
  MAX_JOBS             parallel compile jobs (default: all cores)
  CUDA_HOME            defaults to /usr/local/cuda (torch would otherwise guess /usr/local)
  SONICMOE_PREBUILT_KERNELS
                       a libsonicmoe_kernels.a that CMake built elsewhere from the same sources
                       (same CUDA, same archs): no CMake step, only the torch layer is compiled
                       and linked against it (a lent GPU machine's minutes go to running, not to
                       compiling CUTLASS units a CPU machine can compile)
"""

import os
import pathlib
import subprocess
import sys

os.environ.setdefault("CUDA_HOME", "/usr/local/cuda")

from setuptools import find_packages, setup  # noqa: E402
from torch.utils.cpp_extension import BuildExtension, CUDAExtension  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent
CMAKE_BUILD_DIR = ROOT / "build" / "cmake"
PREBUILT_KERNELS = os.environ.get("SONICMOE_PREBUILT_KERNELS")
KERNELS_LIBRARY = pathlib.Path(PREBUILT_KERNELS).resolve() if PREBUILT_KERNELS else CMAKE_BUILD_DIR / "libsonicmoe_kernels.a"
ARCHS = os.environ.get("SONICMOE_CUDA_ARCHS", "90a")
JOBS = os.environ.get("MAX_JOBS", str(os.cpu_count() or 1))


class CMakeKernelsThenExtension(BuildExtension):
    def run(self):
        if PREBUILT_KERNELS:
            if not KERNELS_LIBRARY.is_file():
                sys.exit(f"SONICMOE_PREBUILT_KERNELS = {PREBUILT_KERNELS}: no such file")
            return super().run()
        subprocess.check_call([sys.executable, str(ROOT / "scripts" / "fetch_cutlass.py")])
        nvcc = pathlib.Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc"
        subprocess.check_call([
            "cmake", "-S", str(ROOT), "-B", str(CMAKE_BUILD_DIR), "-G", "Ninja",
            f"-DSONICMOE_CUDA_ARCHS={ARCHS}", f"-DCMAKE_CUDA_COMPILER={nvcc}",
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
    name="sonicmoe",
    version="0.1.0",
    package_dir={"": "python"},
    packages=find_packages("python"),
    ext_modules=[extension],
    cmdclass={"build_ext": CMakeKernelsThenExtension},
)
