"""Builds the Python package shmdist with CMake: the extension shmdist._C (the torch backend
"shm", against the torch of the interpreter running pip) and the shmrun launcher, then lays
them out as a package. pyproject.toml holds the metadata; this file only drives CMake.

The torch to build against is the one the installing interpreter imports. pip's isolated
build environment hides the environment's own packages (through PYTHONPATH and a
sitecustomize), so CMake and its probe of torch run with PYTHONPATH removed: they see the
environment the package goes into, and so the torch it will run with.

On Debian, missing packages (compiler, CMake, Boost, CLI11) are installed first by
scripts/install-deps, which does nothing when they are present; elsewhere they must be there.
"""

import os
import pathlib
import re
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).resolve().parent


def version():
    text = (ROOT / "CMakeLists.txt").read_text()
    return re.search(r"project\(shmdist VERSION ([0-9.]+)", text).group(1)


def outside_build_isolation():
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.pop("PYTHONNOUSERSITE", None)
    return env


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        env = outside_build_isolation()
        probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"],
                               env=env, capture_output=True, text=True)
        if probe.returncode != 0:
            sys.exit("shmdist: torch is not importable by " + sys.executable + " (" +
                     (probe.stderr.strip().splitlines() or ["?"])[-1] + "); install torch "
                     "into this environment first (pip install torch==2.13.0), then shmdist")
        print(f"shmdist: building against torch {probe.stdout.strip()} of {sys.executable}",
              flush=True)
        deps = ROOT / "scripts" / "install-deps"
        if deps.exists() and shutil.which("dpkg-query"):  # Debian: install what is missing
            subprocess.run([str(deps)], check=True, env=env)
        build = pathlib.Path(self.build_temp).resolve() / "cmake"
        build.mkdir(parents=True, exist_ok=True)
        configure = subprocess.run(
            ["cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
             f"-DSHMDIST_PYTHON_EXECUTABLE={sys.executable}", "-DSHMDIST_PYTHON=ON",
             "-DSHMDIST_PYTHON_EXTRA_EXECUTABLES=",
             "-DSHMDIST_BUILD_TESTS=OFF", "-DSHMDIST_BUILD_EXAMPLES=OFF",
             "-DSHMDIST_BUILD_BENCH=OFF"], env=env, capture_output=True, text=True)
        print(configure.stdout, configure.stderr, sep="", flush=True)
        if configure.returncode != 0:
            sys.exit("shmdist: CMake could not configure the build (its messages are above)")
        skipped = re.search(r"the torch backend is not built: (.*)", configure.stdout)
        if skipped:
            sys.exit("shmdist: the torch backend cannot be built: " + skipped.group(1))
        jobs = str(os.cpu_count() or 1)
        subprocess.run(["cmake", "--build", str(build), "-j", jobs, "--target", "shmdist_python",
                        "shmrun"], check=True, env=env)
        built = next((build / "python" / "shmdist").glob("_C*.so"))
        target = pathlib.Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, target)
        launcher = target.parent / "bin" / "shmrun"
        launcher.parent.mkdir(exist_ok=True)
        shutil.copy2(build / "launcher" / "shmrun", launcher)


setup(
    version=version(),
    packages=["shmdist"],
    package_dir={"": "python"},
    ext_modules=[Extension("shmdist._C", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    zip_safe=False,
    # Not build/, where scripts/test keeps its CMake tree.
    options={"build": {"build_base": "build-pip"}},
)
