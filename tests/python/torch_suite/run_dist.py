#!/usr/bin/python3
"""torch's own distributed tests (torch/testing/_internal/distributed/distributed_test.py,
DistributedTest._DistTestBase, as torch's test/distributed/test_distributed_spawn.py runs
them) against backend "shm", or any backend torch knows.

    BACKEND=shm PYTHONPATH=<build>/python:tests/python/torch_suite \\
        /usr/bin/python3 tests/python/torch_suite/run_dist.py [--world-size 2] [--list FILE] \\
        [unittest options and test names]

With --list, runs the tests named in FILE (one a line, '#' comments), else every test given
(or all of them). torch's test modules import expecttest, which Debian lacks: the stand-in
next to this file provides what they use. torch decides some tests by backend name: "shm" is
added to its "plugin" and "subgroup" feature sets, as a third-party backend would be.
"""
import atexit
import os
import shutil
import sys
import tempfile

# torch's common_utils treats a set CI variable as "torch's own CI": it then writes XML
# reports through xmlrunner (not a Debian package) and changes other defaults. Our CI is not
# torch's, so the variable goes before torch's test modules read it (the ranks inherit this).
os.environ.pop("CI", None)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # the expecttest stand-in, also in the spawned ranks

def names_from(path):
    with open(path) as f:
        lines = (line.split("#", 1)[0].strip() for line in f)
        return ["TestDistBackendWithSpawn." + n for n in lines if n]

def take_own_options(argv):
    """--world-size N and --list FILE, removed from argv before torch's modules parse it."""
    if "--world-size" in argv:
        i = argv.index("--world-size")
        os.environ["WORLD_SIZE"] = argv[i + 1]
        del argv[i:i + 2]
    if "--list" in argv:
        i = argv.index("--list")
        names = names_from(argv[i + 1])
        del argv[i:i + 2]
        argv += names

if __name__ == "__main__":
    take_own_options(sys.argv)

BACKEND = os.environ.setdefault("BACKEND", "shm")
os.environ.setdefault("WORLD_SIZE", "2")
if "TEMP_DIR" not in os.environ:  # the main process only: the ranks inherit it
    os.environ["TEMP_DIR"] = tempfile.mkdtemp(prefix="shmdist-torch-suite-")
    atexit.register(shutil.rmtree, os.environ["TEMP_DIR"], True)
if BACKEND == "shm":
    import shmdist.torch  # noqa: F401  (registers "shm" in every rank: they import this module)
    from torch.testing._internal.common_distributed import DistTestCases
    for feature in ("plugin", "subgroup"):
        DistTestCases.backend_feature[feature].add("shm")

from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest, TestDistBackend)

class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()

if __name__ == "__main__":
    run_tests()
