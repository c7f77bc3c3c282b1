"""The compiled core of the Python package, built through the project's CMake (pyproject.toml).

`pip install .` configures CMake in a build folder of its own (or MEMBUDGET_BUILD_DIR, an existing
CMake build of this checkout, which then only builds what changed), builds the target
membudget_python (the pybind11 module membudget/_core with the library and the command line in
it), and copies it into the wheel beside python/membudget/*.py. Tests, benchmarks, fuzzers and the
CUDA plugin are not built: the package predicts, and `verify` measures with the CPU backend.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = Path(os.environ.get("MEMBUDGET_BUILD_DIR") or Path(self.build_temp) / "cmake").resolve()
        build_dir.mkdir(parents=True, exist_ok=True)
        configure = ["cmake", "-S", str(ROOT), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
                     f"-DPython_EXECUTABLE={sys.executable}", "-DMEMBUDGET_PYTHON=ON"]
        if not os.environ.get("MEMBUDGET_BUILD_DIR"):
            configure += ["-DMEMBUDGET_TESTS=OFF", "-DMEMBUDGET_BENCH=OFF", "-DMEMBUDGET_FUZZ=OFF",
                          "-DMEMBUDGET_CUDA=OFF"]
            if shutil.which("ninja"):
                configure += ["-G", "Ninja"]
        subprocess.run(configure, check=True)
        subprocess.run(["cmake", "--build", str(build_dir), "--target", "membudget_python", "-j",
                        str(os.cpu_count() or 2)], check=True)
        built = sorted((build_dir / "python" / "membudget").glob("_core*.so"))
        if not built:
            sys.exit(f"setup.py: CMake built no membudget/_core module in {build_dir}/python/membudget "
                     "(is pybind11-dev installed? tools/setup.sh installs it)")
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built[-1], target)


setup(ext_modules=[CMakeExtension("membudget._core")], cmdclass={"build_ext": CMakeBuild})
