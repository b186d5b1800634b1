"""Shared fixtures of the torch backend tests: how to start jobs (shmrun, torchrun, plain
env:// processes), bounded in time, and the check that they leave nothing in /dev/shm."""

import os
import pathlib
import signal
import subprocess
import sys
import time
import uuid

import pytest

from emulated_hosts import free_port  # noqa: F401 - the tests take it from here

HERE = pathlib.Path(__file__).resolve().parent
WORKERS = HERE / "workers"
SOURCE_DIR = HERE.parents[1]
SHMRUN = os.environ.get("SHMDIST_TEST_SHMRUN", "")
PYTHONPATH = os.environ.get("SHMDIST_TEST_PYTHONPATH", "")
PYTHON = sys.executable


def _why_unavailable():
    try:
        import torch  # noqa: F401
        import torch.distributed  # noqa: F401
    except ImportError as e:
        return f"torch is not importable from {PYTHON} ({e}); apt-get install python3-torch"
    if not SHMRUN or not PYTHONPATH:
        return "SHMDIST_TEST_SHMRUN / SHMDIST_TEST_PYTHONPATH are not set (run these tests through ctest)"
    return None


WHY = _why_unavailable()

# The names this session's jobs make in /dev/shm carry its own tag (SHMDIST_SHM_TAG, which
# every job started from here inherits), and the leak check looks at those only: another
# program's objects (another checkout's suite, a user's job) can neither fail it nor hide
# behind it.
SHM_TAG = f"py{os.getpid()}_{uuid.uuid4().hex[:16]}"
os.environ["SHMDIST_SHM_TAG"] = SHM_TAG
SHM_PREFIX = f"shmdist-{os.getuid()}-{SHM_TAG}-"


def pytest_collection_modifyitems(config, items):
    if WHY:
        for item in items:
            item.add_marker(pytest.mark.skip(reason=WHY))


def shm_names():
    """The names in /dev/shm that this session's jobs made."""
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith(SHM_PREFIX)}
    except FileNotFoundError:
        return set()


@pytest.fixture(autouse=True)
def no_leftovers():
    """No object a test's jobs made in /dev/shm may outlive it (after 5 s for processes
    still exiting)."""
    before = shm_names()
    yield
    deadline = time.monotonic() + 5
    new = shm_names() - before
    while new and time.monotonic() < deadline:
        time.sleep(0.2)
        new &= shm_names()
    assert not new, f"left in /dev/shm: {sorted(new)}"


def base_env(extra=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [PYTHONPATH, str(WORKERS), env.get("PYTHONPATH", "")] if p)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SHMDIST_SEGMENT_FD",
              "SHMDIST_SEGMENT", "SHMDIST_JOB_KEY"):
        env.pop(k, None)
    env.update(extra or {})
    return env


class Result:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr

    def __repr__(self):
        return f"exit {self.returncode}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"


def _communicate(procs, timeout):
    """Waits for every process (each in the process group of the first); on timeout kills
    the whole group and fails. Returns the Results in order."""
    deadline = time.monotonic() + timeout
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=max(1, deadline - time.monotonic()))
            results.append(Result(p.returncode, out, err))
    except subprocess.TimeoutExpired:
        os.killpg(procs[0].pid, signal.SIGKILL)
        for p in procs:
            p.communicate()
        pytest.fail(f"the job did not finish within {timeout} s and was killed")
    return results


def run(cmd, timeout=240, env=None):
    """Runs one command (shmrun, torchrun) in a process group of its own."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env or base_env(), start_new_session=True, cwd=WORKERS)
    return _communicate([p], timeout)[0]


def shmrun(n, script, *args, timeout=240, env=None):
    return run([SHMRUN, "-n", str(n), "--timeout", f"{timeout - 20}s", PYTHON, str(script), *args],
               timeout, env)


def torchrun(n, script, *args, timeout=240, env=None):
    # Debian's torch 1.13 on Python 3.11: torchrun's default --redirects/--tee of 0 fail
    # ("'NoneType' object has no attribute 'get'": enum.IntFlag iteration skips 0 there);
    # any nonzero value works, and 2 (stderr) leaves stdout as the program wrote it.
    #
    # Not --standalone: it puts torchrun's rendezvous store on the fixed port 29400, so two
    # torchrun jobs on one host at once (this suite in two checkouts) share one store, and
    # when the other job ends first this one fails with "The connection to the C10d store
    # has failed". These are --standalone's settings with a free port instead.
    return run([PYTHON, "-m", "torch.distributed.run", *standalone_rendezvous(),
                f"--nproc_per_node={n}", "--redirects", "2", "--tee", "2", str(script), *args],
               timeout, env)


def standalone_rendezvous(port=None):
    return ["--nnodes=1", "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port or free_port()}",
            f"--rdzv_id={uuid.uuid4()}"]


def start_env_ranks(n, script, *args, extra_env=None, init="env://"):
    """Starts n ranks as plain processes with torchrun-style variables (no launcher)."""
    port = str(free_port())
    procs = []
    for r in range(n):
        env = base_env({"RANK": str(r), "WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": port, "SHMDIST_TEST_INIT": init, **(extra_env or {})})
        kwargs = {"process_group": 0 if r == 0 else procs[0].pid}  # one group: killable at once
        procs.append(subprocess.Popen([PYTHON, str(script), *args], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, env=env, cwd=WORKERS,
                                      **kwargs))
    return procs


def env_ranks(n, script, *args, timeout=240, extra_env=None, init="env://"):
    return _communicate(start_env_ranks(n, script, *args, extra_env=extra_env, init=init), timeout)


def failures(text):
    return [line for line in text.splitlines() if line.startswith("FAIL")]
