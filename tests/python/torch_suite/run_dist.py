#!/usr/bin/python3
"""torch's own distributed tests (torch/testing/_internal/distributed/distributed_test.py,
DistributedTest._DistTestBase, as torch's test/distributed/test_distributed_spawn.py runs
them) against backend "shm", or any backend torch knows.

    BACKEND=shm PYTHONPATH=<build>/python PYTHON tests/python/torch_suite/run_dist.py \
        [--world-size 2] [--list FILE] [--as gloo] [--start spawn|fork] [--results OUT] \
        [unittest options and test names]

--list FILE runs the tests named in FILE (gloo_passes.txt's format: a name a line, '#'
comments, a line marked differs-on-shm is left out on "shm", one marked differs-with-as is left
out with --as), else every test given (or all of them).
--as gloo (with BACKEND=shm): torch's test module is told BACKEND=gloo, so it picks and judges
every test as it does for gloo (its many `BACKEND in {...}` checks), while every process group
a test asks for with backend "gloo" is made by "shm": gloo's tests, on "shm".
--start fork forks each test's ranks from this process, which has imported torch's test module
already, instead of spawning them (torch's way), which imports it afresh in every rank of every
test (~3 s of CPU a rank); the tests' outcomes on gloo were the same both ways (all 279 of
torch 1.13's; the 90 of torch 2.13's that pass).
--results OUT appends one line per test to OUT: "start NAME" when it begins, then
"NAME<TAB>outcome<TAB>seconds<TAB>reason" (outcome pass, skip, fail, error, xfail, xpass);
survey.py drives whole runs through it.

PYTHON is the interpreter the backend was built for: Debian's torch 1.13 (/usr/bin/python3) or a
torch 2.x (2.13: a venv with pip's torch, numpy and pytest). torch's test modules import
expecttest, which Debian lacks and pip's torch does not require: the stand-in next to this file
provides what they use (torch 1.13's and 2.13's alike), so neither needs it installed. torch decides some tests by backend name: "shm" is added to its
"plugin" and "subgroup" feature sets, as a third-party backend would be. The run fails if its
ranks leave a name in /dev/shm (names carry the run's own SHMDIST_SHM_TAG, so another
program's objects do not count).
"""
import atexit
import os
import re
import shutil
import sys
import tempfile
import time
import uuid

# torch's common_utils treats a set CI variable as "torch's own CI": it then writes XML
# reports through xmlrunner (not a Debian package) and changes other defaults. Our CI is not
# torch's, so the variable goes before torch's test modules read it (the ranks inherit this).
os.environ.pop("CI", None)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # the expecttest stand-in, also in the spawned ranks

START = "spawn"


def names_from(path, leave_out):
    names = []
    with open(path) as f:
        for line in f:
            fields = line.split("#", 1)[0].split()
            if fields and not set(fields[1:]) & leave_out:
                names.append("TestDistBackendWithSpawn." + fields[0])
    return names


def take(argv, flag):
    """The value after flag, both removed from argv; None without flag."""
    if flag not in argv:
        return None
    i = argv.index(flag)
    value = argv[i + 1]
    del argv[i:i + 2]
    return value


def take_own_options(argv):
    """This script's options, removed from argv before torch's modules parse it."""
    global START
    START = take(argv, "--start") or START
    if START not in ("spawn", "fork"):
        sys.exit(f"run_dist.py: --start takes spawn or fork, not {START!r}")
    world = take(argv, "--world-size")
    if world:
        os.environ["WORLD_SIZE"] = world
    as_backend = take(argv, "--as")
    if as_backend:
        if os.environ.get("BACKEND", "shm") != "shm":
            sys.exit(f"run_dist.py: --as {as_backend} runs on backend shm, but BACKEND is "
                     f"{os.environ['BACKEND']!r}; unset it or set BACKEND=shm")
        os.environ["SHMDIST_SUITE_AS"] = as_backend
    results = take(argv, "--results")
    if results:
        record_results_in(results)
    listed = take(argv, "--list")
    if listed:
        on_shm = os.environ.get("BACKEND", "shm") == "shm"
        leave_out = ({"differs-on-shm"} if on_shm else set()) | (
            {"differs-with-as"} if as_backend else set())
        argv += names_from(listed, leave_out)


def shm_prefix():
    """How every name this run's ranks make in /dev/shm begins: they inherit the tag that
    the main process sets (SHMDIST_SHM_TAG), so other programs' objects are not counted."""
    return f"shmdist-{os.getuid()}-{os.environ['SHMDIST_SHM_TAG']}-"


def shm_names():
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith(shm_prefix())}
    except FileNotFoundError:
        return set()


def left_in_dev_shm(before):
    """Names this run's ranks made since `before` that remain (after 5 s for processes
    still exiting)."""
    new = shm_names() - before
    deadline = time.monotonic() + 5
    while new and time.monotonic() < deadline:
        time.sleep(0.2)
        new &= shm_names()
    return sorted(new)


def record_results_in(path):
    """Every unittest result (whatever runner torch's run_tests picks) also goes to path."""
    import unittest

    def write(line):
        with open(path, "a") as f:
            f.write(line + "\n")

    def name(test):
        return test.id().rsplit(".", 1)[-1]

    started = {}
    base = unittest.TestResult
    original = {m: getattr(base, m) for m in ("startTest", "addSuccess", "addSkip", "addFailure",
                                              "addError", "addExpectedFailure",
                                              "addUnexpectedSuccess")}

    def start(self, test):
        started[test.id()] = time.monotonic()
        write("start " + name(test))
        original["startTest"](self, test)

    def outcome(method, label, why=lambda args: ""):
        def add(self, test, *args):
            took = time.monotonic() - started.get(test.id(), time.monotonic())
            reason = " ".join(why(args).split())[:300]
            write(f"{name(test)}\t{label}\t{took:.1f}\t{reason}")
            original[method](self, test, *args)
        return add

    def error_text(args):
        kind, value, _ = args[0]
        lines = [l for l in str(value).splitlines() if l.strip()]
        # torch 2.x ends a rank's traceback with how to rerun the test: not the reason.
        for i, l in enumerate(lines):
            if l.startswith("To execute this test, run the following"):
                lines = lines[:i]
                break
        lines = lines or [""]
        # A rank's failure arrives as its whole traceback: its first line and its last
        # exception line say it (an assertion's diff may follow that).
        said = [l for l in lines[1:] if re.match(r"[\w.]+(Error|Exception|Timeout): ", l)]
        last = said[-1] if said else lines[-1]
        return f"{kind.__name__}: {lines[0]}" + (f" | {last}" if len(lines) > 1 else "")

    base.startTest = start
    base.addSuccess = outcome("addSuccess", "pass")
    base.addSkip = outcome("addSkip", "skip", lambda args: str(args[0]))
    base.addFailure = outcome("addFailure", "fail", error_text)
    base.addError = outcome("addError", "error", error_text)
    base.addExpectedFailure = outcome("addExpectedFailure", "xfail")
    base.addUnexpectedSuccess = outcome("addUnexpectedSuccess", "xpass")

if __name__ == "__main__":
    take_own_options(sys.argv)

# SHMDIST_SUITE_AS=gloo (--as gloo): torch's test module is told BACKEND=gloo, so it picks and
# judges every test as it does for gloo (its many `BACKEND in {...}` checks), while every
# process group a test asks for with backend "gloo" is made by "shm": gloo's tests, on "shm".
AS = os.environ.get("SHMDIST_SUITE_AS")
if AS:
    os.environ["BACKEND"] = AS
BACKEND = os.environ.setdefault("BACKEND", "shm")
os.environ.setdefault("WORLD_SIZE", "2")
if "TEMP_DIR" not in os.environ:  # the main process only: the ranks inherit it
    os.environ["TEMP_DIR"] = tempfile.mkdtemp(prefix="shmdist-torch-suite-")
    atexit.register(shutil.rmtree, os.environ["TEMP_DIR"], True)
if BACKEND == "shm" or AS:
    import shmdist.torch  # noqa: F401  (registers "shm" in every rank: they import this module)
    from torch.testing._internal.common_distributed import DistTestCases
    for feature in ("plugin", "subgroup"):
        DistTestCases.backend_feature[feature].add("shm")
if AS:
    from torch.distributed import distributed_c10d

    def made_by_shm(helper):
        def new_process_group(group_size, group_rank, global_ranks, backend, *args, **kwargs):
            if str(backend).lower() == AS:
                backend = "shm"
            return helper(group_size, group_rank, global_ranks, backend, *args, **kwargs)
        return new_process_group
    distributed_c10d._new_process_group_helper = made_by_shm(
        distributed_c10d._new_process_group_helper)

from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest, TestDistBackend)

class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        if START == "spawn":
            self._spawn_processes()  # as torch's test_distributed_spawn.py
        else:
            # Forked from this process, which has imported torch's test module already (a
            # spawned rank imports it afresh: ~3 s of CPU a rank). The forked rank begins in
            # as_if_spawned; multiprocessing ends it with os._exit, so this process's atexit
            # handlers do not run in it.
            import torch.multiprocessing
            process = torch.multiprocessing.get_context("fork").Process

            def start(target, name, args, kwargs=None):  # torch 2.x passes kwargs too
                return process(target=as_if_spawned, name=name, args=(target, *args),
                               kwargs=kwargs or {})
            self._start_processes(start)


def as_if_spawned(target, *args, **kwargs):
    """A forked rank's start: what torch's test module reads from the environment when
    imported, as a spawned rank (which imports it after the test's setUp) sees it."""
    from torch.testing._internal.distributed import distributed_test
    distributed_test.INIT_METHOD = os.getenv("INIT_METHOD", "env://")
    target(*args, **kwargs)

if __name__ == "__main__":
    os.environ["SHMDIST_SHM_TAG"] = f"suite{os.getpid()}_{uuid.uuid4().hex[:16]}"
    before = shm_names()
    try:
        run_tests()
        status = 0
    except SystemExit as e:
        status = e.code
    left = left_in_dev_shm(before)
    if left:
        print(f"run_dist.py: left in /dev/shm: {left}", file=sys.stderr)
        status = status or 1
    sys.exit(status)
