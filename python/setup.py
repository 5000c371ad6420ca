"""Installs the meshtrain Python package (docs/python.md), offline, with one command:

    python3 -m venv --system-site-packages ~/mt && ~/mt/bin/pip install --no-index --no-build-isolation ./python

It packages the extension CMake built (build/python/meshtrain/_meshtrain*.so, or
$MESHTRAIN_BUILD_DIR/python/meshtrain/) with the package's Python files and the `meshtrain`
program (the package runs it to measure the machine for the cost model once). When the
extension for this interpreter is not built yet, it runs CMake first: configure ../build if
needed, then build the targets _meshtrain and meshtrain.
"""

import os
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BUILD = os.path.abspath(os.environ.get("MESHTRAIN_BUILD_DIR", os.path.join(ROOT, "build")))


def built_files():
    """The extension for this interpreter and the program, built by CMake (now, if missing)."""
    ext = os.path.join(BUILD, "python", "meshtrain", "_meshtrain" + sysconfig.get_config_var("EXT_SUFFIX"))
    program = os.path.join(BUILD, "meshtrain")
    if not os.path.isfile(ext) or not os.path.isfile(program):
        print(f"meshtrain: building the extension for {sys.executable} in {BUILD} (cmake)", flush=True)
        try:
            if not os.path.isfile(os.path.join(BUILD, "CMakeCache.txt")):
                subprocess.check_call(["cmake", "-S", ROOT, "-B", BUILD, "-DCMAKE_BUILD_TYPE=Release",
                                       "-DPython3_EXECUTABLE=" + os.path.realpath(sys.executable)])
            subprocess.check_call(["cmake", "--build", BUILD, "--target", "_meshtrain", "meshtrain",
                                   "-j", str(os.cpu_count() or 1)])
        except (OSError, subprocess.CalledProcessError) as e:
            sys.exit(f"meshtrain: building the extension with CMake in {BUILD} failed ({e}); it needs cmake, "
                     "and a build folder with the target _meshtrain (CMake leaves it out without python3-dev or "
                     "pybind11-dev, and says which in a note): install them and run cmake again")
    if not os.path.isfile(ext):
        sys.exit(f"meshtrain: {ext} was not built: CMake skipped the Python module (its note says why: "
                 "python3-dev and pybind11-dev are needed), or built it for another Python "
                 f"(set -DPython3_EXECUTABLE={os.path.realpath(sys.executable)})")
    return ext, program


class BuildWithExtension(build_py):
    """The package's Python files, then the extension and the program beside them."""

    def run(self):
        super().run()
        ext, program = built_files()
        dest = os.path.join(self.build_lib, "meshtrain")
        os.makedirs(os.path.join(dest, "bin"), exist_ok=True)
        shutil.copy2(ext, dest)
        shutil.copy2(program, os.path.join(dest, "bin", "meshtrain"))


class BinaryDistribution(Distribution):
    """A wheel for this platform and Python (it holds a compiled extension)."""

    def has_ext_modules(self):
        return True


setup(
    name="meshtrain",
    version="0.1.0",
    description="Distributed training (DP x TP x PP) of neural networks, from Python",
    packages=["meshtrain"],
    python_requires=">=3.9",
    install_requires=[],
    cmdclass={"build_py": BuildWithExtension},
    distclass=BinaryDistribution,
    zip_safe=False,
)
