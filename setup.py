"""Builds the Python package shmdist with CMake: the extension shmdist._C (the torch backend
"shm", against the torch of the interpreter running pip) and the shmrun launcher, then lays
them out as a package. pyproject.toml holds the metadata; this file only drives CMake.

The torch to build against is the one the installing interpreter imports. pip's isolated
build environment hides the environment's own packages (through PYTHONPATH and a
sitecustomize), so CMake and its probe of torch run with PYTHONPATH removed: they see the
environment the package goes into, and so the torch it will run with.

On Debian, missing packages (compiler, CMake, Boost, CLI11) are installed first by
scripts/install-deps, which does nothing when they are present; elsewhere they must be there.

The package requires exactly the torch release it was built against (torch==2.13.0 when built
against 2.13.0+cpu), as other torch extensions do: a wheel made by `pip wheel .` installs on
another machine without a compiler, beside that torch only. When torch is missing, the
requirement is left out and the build stops, saying to install torch first.

pip shows a build backend's output only with -v, and the build takes minutes: progress (the
torch built against, the steps, the compile's percentage) also goes to the terminal, /dev/tty,
when there is one.
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


def installed_torch():
    """(version, None) of the torch the target environment imports, or (None, why not)."""
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"],
                           env=outside_build_isolation(), capture_output=True, text=True)
    if probe.returncode != 0:
        return None, (probe.stderr.strip().splitlines() or ["?"])[-1]
    return probe.stdout.strip(), None


def torch_requirement():
    """torch==<the release built against>, without the local label (+cpu): the one torch the
    extension loads into. None without torch: the build then refuses (build_extension)."""
    version, _ = installed_torch()
    return None if version is None else "torch==" + version.split("+")[0]


def open_terminal():
    try:
        return open("/dev/tty", "w")
    except OSError:
        return None


class Progress:
    """Says what the build does, in pip's log (stdout) and on the terminal when there is one."""

    def __init__(self):
        self.terminal = open_terminal()
        if self.terminal:
            self.terminal.write("\n")  # off pip's spinner line

    def say(self, message):
        print("shmdist: " + message, flush=True)
        if self.terminal:
            self.terminal.write("shmdist: " + message + "\n")
            self.terminal.flush()


def run_cmake_build(command, env, progress):
    """Runs `cmake --build`, its output to pip's log, and every tenth percent to progress."""
    build = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    shown = -10
    for line in build.stdout:
        print(line, end="", flush=True)
        step = re.match(r"\[\s*(\d+)%\]", line)
        if step and int(step.group(1)) >= shown + 10:
            shown = int(step.group(1))
            progress.say(f"compiling: {shown}%")
    if build.wait() != 0:
        sys.exit("shmdist: the build failed (pip install -v . shows the compiler's messages)")


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        env = outside_build_isolation()
        progress = Progress()
        torch_version, why = installed_torch()
        if torch_version is None:
            sys.exit("shmdist: torch is not importable by " + sys.executable + " (" + why +
                     "); install torch into this environment first (pip install "
                     "torch==2.13.0), then shmdist")
        progress.say(f"building against torch {torch_version} of {sys.executable} (the "
                     f"package will require torch=={torch_version.split('+')[0]})")
        deps = ROOT / "scripts" / "install-deps"
        if deps.exists() and shutil.which("dpkg-query"):  # Debian: install what is missing
            progress.say("checking the Debian build packages (scripts/install-deps)")
            subprocess.run([str(deps)], check=True, env=env)
        build = pathlib.Path(self.build_temp).resolve() / "cmake"
        build.mkdir(parents=True, exist_ok=True)
        progress.say("configuring with CMake")
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
        progress.say(f"compiling the extension and shmrun ({jobs} jobs)")
        run_cmake_build(["cmake", "--build", str(build), "-j", jobs, "--target",
                         "shmdist_python", "shmrun"], env, progress)
        package = build / "python" / "shmdist"
        built = next(package.glob("_C*.so"))
        target = pathlib.Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, target)
        shutil.copy2(package / "_build_info.py", target.parent / "_build_info.py")
        launcher = target.parent / "bin" / "shmrun"
        launcher.parent.mkdir(exist_ok=True)
        shutil.copy2(build / "launcher" / "shmrun", launcher)
        progress.say("built")


requirement = torch_requirement()
setup(
    version=version(),
    install_requires=[requirement] if requirement else [],
    packages=["shmdist", "shmdist._hosts"],
    package_dir={"": "python"},
    ext_modules=[Extension("shmdist._C", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    zip_safe=False,
    # Not build/, where scripts/test keeps its CMake tree.
    options={"build": {"build_base": "build-pip"}},
)
