"""The leak check of these tests (conftest.no_leftovers, issue 27 item 15): it counts the
names this session's jobs make in /dev/shm, which carry its SHMDIST_SHM_TAG, and not another
program's (an untagged shmdist job's, another suite's), which used to fail whichever test
was running. (tests/support/test_leak_check.cpp shows that shmdist's jobs put the tag into
their names and that a leak of the test's own job is reported.)"""

import os
import uuid

from conftest import SHM_PREFIX, SHM_TAG, shm_names


def test_only_this_sessions_names_are_counted():
    assert os.environ["SHMDIST_SHM_TAG"] == SHM_TAG  # what every job started here inherits
    hexa = uuid.uuid4().hex
    own = f"{SHM_PREFIX}rv-{hexa[:16]}"
    others = [f"shmdist-{os.getuid()}-rv-{hexa[16:]}",
              f"shmdist-{os.getuid()}-another_suite-rv-{hexa[16:]}"]
    made = []
    try:
        for name in [own, *others]:
            with open(f"/dev/shm/{name}", "x"):
                made.append(name)
        names = shm_names()
        assert own in names
        for name in others:
            assert name not in names
    finally:
        for name in made:
            os.unlink(f"/dev/shm/{name}")
