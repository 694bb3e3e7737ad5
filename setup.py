"""pip install . -- builds the favor Python package with the project's own CMake.

The extension favor._core is the CMake target favor_python, linked against a static
libfavor (so the installed package needs no libfavor.so) and, dynamically, the system
OpenBLAS and OpenMP. Nothing is downloaded: CMake finds the Debian packages the C++ build
uses (see README.md), pybind11 included, and setuptools and wheel come from the current
environment. There is deliberately no pyproject.toml: with one, pip would build in an
isolated environment and fetch setuptools from the package index.

    /usr/bin/python3 -m venv --system-site-packages VENV   # Debian's numpy, setuptools, wheel
    VENV/bin/pip install .

Extra CMake arguments: CMAKE_ARGS="-DCMAKE_CXX_COMPILER=clang++ ..."; parallel jobs:
CMAKE_BUILD_PARALLEL_LEVEL (default: all cores).
"""
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, find_packages, setup
try:
    from setuptools.command.build import build
except ImportError:  # setuptools < 65
    from distutils.command.build import build
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


def project_version():
    with open(os.path.join(ROOT, "CMakeLists.txt"), encoding="utf-8") as f:
        m = re.search(r"^project\(\s*favor\s+VERSION\s+([0-9][0-9.]*)", f.read(), re.M)
    if not m:
        raise RuntimeError("setup.py: no 'project(favor VERSION x.y.z' line in CMakeLists.txt")
    return m.group(1)


class CMakeExtension(Extension):
    """An extension built by a CMake target; CMake writes it to <staging>/favor/<name>*.so."""

    def __init__(self, name, target):
        super().__init__(name, sources=[])
        self.target = target


class Build(build):
    """Keep setuptools' build tree out of ./build, which is the CMake build folder of the
    C++ project (README.md); /build*/ is in .gitignore."""

    def initialize_options(self):
        super().initialize_options()
        self.build_base = "build-pip"


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = os.path.abspath(self.build_temp)
        staging = os.path.join(build_dir, "python")
        configure = [
            "cmake", "-S", ROOT, "-B", build_dir,
            "-DCMAKE_BUILD_TYPE=Release",
            "-DFAVOR_BUILD_TOOLS=OFF", "-DFAVOR_BUILD_TESTS=OFF", "-DFAVOR_BUILD_BENCH=OFF",
            "-DFAVOR_BUILD_PYTHON=ON",
            # libfavor goes inside the extension: static, compiled as position-independent code.
            "-DBUILD_SHARED_LIBS=OFF", "-DCMAKE_POSITION_INDEPENDENT_CODE=ON",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-DFAVOR_PYTHON_OUTPUT_DIR={staging}",
        ] + shlex.split(os.environ.get("CMAKE_ARGS", ""))
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
        compile_ = ["cmake", "--build", build_dir, "--target", ext.target, "-j", jobs]
        for cmd in (configure, compile_):
            print(" ".join(shlex.quote(a) for a in cmd), flush=True)
            subprocess.run(cmd, check=True)

        leaf = ext.name.rpartition(".")[2]
        built = glob.glob(os.path.join(staging, *ext.name.split(".")[:-1], leaf + "*.so"))
        if len(built) != 1:
            raise RuntimeError(f"setup.py: expected one {leaf}*.so under {staging}, found {built} "
                               "(did CMake say 'favor Python package: off'?)")
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        # The build tree's copy carries CMake's build RPATH: the folder of the OpenBLAS it
        # linked (the OpenMP build, cmake/FindFavorBLAS.cmake), and nothing in build_dir.
        shutil.copyfile(built[0], dest)
        shutil.copymode(built[0], dest)


setup(
    name="favor",
    version=project_version(),
    description="Fast random-feature attention (FAVOR+) on the CPU",
    python_requires=">=3.8",
    install_requires=["numpy"],
    package_dir={"": "python"},
    packages=find_packages(where="python", include=["favor", "favor.*"]),
    ext_modules=[CMakeExtension("favor._core", target="favor_python")],
    cmdclass={"build": Build, "build_ext": CMakeBuild},
    zip_safe=False,
)
