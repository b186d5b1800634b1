"""Running the instruments: finding the build, building command lines, running each one
under a time limit (its whole process group is stopped on expiry) and parsing the OSU-style
output. Standard library only."""
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field

BENCH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO_DIR = os.path.dirname(BENCH_DIR)
SYSTEM_PYTHON = "/usr/bin/python3"


class CompareError(Exception):
    """A problem that stops the whole comparison (bad build dir, bad options)."""


@dataclass
class Tools:
    build_dir: str
    shmrun: str
    bench: str
    floor: str
    mpi_bench: str = ""  # empty when MPI is not available
    mpirun: str = ""
    gloo_script: str = ""  # empty when torch/gloo is not importable
    notes: list = field(default_factory=list)  # why something is skipped


def _is_build_dir(path):
    return (os.path.isfile(os.path.join(path, "launcher", "shmrun")) and
            os.path.isfile(os.path.join(path, "bench", "shmdist-bench")))


def find_build_dir(explicit):
    """The build tree holding launcher/shmrun and bench/shmdist-bench."""
    if explicit:
        path = os.path.abspath(explicit)
        if not _is_build_dir(path):
            raise CompareError(
                "%s is not a shmdist build directory (no launcher/shmrun and bench/shmdist-bench "
                "in it); build first: cmake -S %s -B %s && cmake --build %s -j2"
                % (path, REPO_DIR, path, path))
        return path
    candidates = [os.environ.get("SHMDIST_BUILD_DIR", ""), os.path.join(os.getcwd(), "build"),
                  os.path.join(REPO_DIR, "build"), os.getcwd()]
    for c in candidates:
        if c and _is_build_dir(os.path.abspath(c)):
            return os.path.abspath(c)
    raise CompareError(
        "no shmdist build directory found (looked for launcher/shmrun and bench/shmdist-bench in "
        "$SHMDIST_BUILD_DIR, ./build, %s/build and .); build with "
        "'cmake -S %s -B build && cmake --build build -j2', or pass --build-dir DIR"
        % (REPO_DIR, REPO_DIR))


def find_tools(build_dir, want_mpi=True, want_gloo=True, timeout=60):
    b = os.path.join(build_dir, "bench")
    tools = Tools(build_dir=build_dir, shmrun=os.path.join(build_dir, "launcher", "shmrun"),
                  bench=os.path.join(b, "shmdist-bench"), floor=os.path.join(b, "shmdist-floor"))
    if not os.path.isfile(tools.floor):
        raise CompareError("%s is missing; rebuild (cmake --build %s)" % (tools.floor, build_dir))
    if want_mpi:
        mpi_bench = os.path.join(b, "shmdist-mpi-bench")
        mpirun = shutil.which("mpirun")
        if not os.path.isfile(mpi_bench):
            tools.notes.append("Open MPI skipped: %s was not built (no MPI found by CMake; "
                               "apt-get install openmpi-bin libopenmpi-dev, then reconfigure)"
                               % mpi_bench)
        elif not mpirun:
            tools.notes.append("Open MPI skipped: mpirun is not on PATH")
        else:
            tools.mpi_bench, tools.mpirun = mpi_bench, mpirun
    else:
        tools.notes.append("Open MPI skipped (--no-mpi)")
    if want_gloo:
        script = os.path.join(BENCH_DIR, "gloo", "gloo_bench.py")
        probe = run([SYSTEM_PYTHON, "-c", "import torch.distributed as d; "
                     "assert d.is_available() and d.is_gloo_available()"], timeout)
        if probe.ok:
            tools.gloo_script = script
        else:
            tools.notes.append("gloo skipped: torch with gloo is not importable by %s (%s)"
                               % (SYSTEM_PYTHON, probe.reason))
    else:
        tools.notes.append("gloo skipped (--no-gloo)")
    return tools


# ---- command lines --------------------------------------------------------------------------

def _opts(options):
    # One token per option (--name=value): the launcher may not keep the program's argument
    # order, and a single token survives any order.
    return ["--%s=%s" % (k, v) for k, v in options.items()]


# A run is in the machine's fast state when the cache-line probes around it read within this
# factor of the session's lowest reading (see Session.execute in bench/compare).
GATE_BAND = 2.0


def shmdist_cmd(tools, test, nproc, options, bind, job_timeout):
    cmd = [tools.shmrun, "-n", str(nproc), "--bind-to", "core" if bind else "none",
           "--timeout", "%ds" % job_timeout, "--", tools.bench, test]
    return cmd + _opts(options)


def mpi_cmd(tools, test, nproc, options, bind, cma=True, yield_when_idle=False):
    cmd = [tools.mpirun, "--allow-run-as-root", "-n", str(nproc),
           "--mca", "pml", "ob1", "--mca", "btl", "self,vader"]
    if not cma:
        cmd += ["--mca", "btl_vader_single_copy_mechanism", "none"]
    if yield_when_idle:
        cmd += ["--mca", "mpi_yield_when_idle", "1"]
    cmd += ["--bind-to", "core"] if bind else ["--bind-to", "none", "--oversubscribe"]
    return cmd + [tools.mpi_bench, test] + _opts(options)


def gloo_cmd(tools, test, nproc, options, job_timeout):
    cmd = [SYSTEM_PYTHON, tools.gloo_script, test, "-n", str(nproc),
           "--timeout", str(job_timeout)]
    for k, v in options.items():
        cmd += ["--" + k, str(v)]
    return cmd


def floor_cmd(tools, quick, cacheline_only):
    cmd = [tools.floor]
    if quick:
        cmd.append("--quick")
    if cacheline_only:
        cmd += ["--only", "cacheline"]
    return cmd


# ---- running --------------------------------------------------------------------------------

@dataclass
class Result:
    ok: bool
    stdout: str = ""
    stderr: str = ""
    reason: str = ""  # why it failed
    seconds: float = 0.0


def run(cmd, timeout, env=None):
    """Runs cmd in its own process group; on timeout stops the whole group (TERM, then KILL)."""
    start = time.monotonic()
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env, start_new_session=True, stdin=subprocess.DEVNULL)
    except OSError as e:
        return Result(False, reason="cannot start %s: %s" % (cmd[0], e))
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop_group(proc)
        out, err = proc.communicate()
        return Result(False, out, err, "timed out after %d s" % timeout, time.monotonic() - start)
    except KeyboardInterrupt:
        _stop_group(proc)
        raise
    elapsed = time.monotonic() - start
    if proc.returncode != 0:
        last = [l for l in err.strip().splitlines() if l.strip()]
        why = "exit status %d" % proc.returncode
        if proc.returncode < 0:
            why = "killed by signal %d" % -proc.returncode
        return Result(False, out, err, why + (": " + last[-1][:200] if last else ""), elapsed)
    return Result(True, out, err, "", elapsed)


def _stop_group(proc):
    for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


# ---- parsing --------------------------------------------------------------------------------

def parse_rows(text):
    """OSU-style rows: {size: [values...]} from every line that is not a '#' comment."""
    rows = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts or parts[0].startswith("#"):
            continue
        try:
            rows[int(parts[0])] = [float(x) for x in parts[1:]]
        except ValueError:
            continue
    return rows


def parse_floor(text):
    """shmdist-floor rows: {probe: (median, min, max, unit)}."""
    probes = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 5 or parts[0].startswith("#"):
            continue
        try:
            probes[parts[0]] = (float(parts[1]), float(parts[2]), float(parts[3]), parts[4])
        except ValueError:
            continue
    return probes


def parse_idle(text):
    """shmdist-bench idle rows: [(rank, source, blocked_s, cpu_pct, thread_pct, sleeps)]."""
    rows = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 6 or parts[0].startswith("#"):
            continue
        try:
            rows.append((int(parts[0]), parts[1], float(parts[2]), float(parts[3]),
                         float(parts[4]), float(parts[5])))
        except ValueError:
            continue
    return rows


def shm_entries():
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()
