"""Issue 27.3: a barrier that timed out on some members pairs only with the late member's
barrier of the same number. 3 ranks, the group's timeout SHMDIST_TEST_TIMEOUT_S: ranks 0 and 1
enter barrier #2 without rank 2 and must raise Timeout; then rank 2 enters its barrier #2,
which meets theirs (still pending on them), and pauses before its barrier #3. The barrier #3
of ranks 0 and 1 must not return before rank 2 has entered it (a marker file under
SHMDIST_TEST_DIR says it has); then an all_reduce gives 1 + 2 + 3 on every rank."""

import os
import pathlib
import time

import torch
import torch.distributed as dist

from common import finish, init, say

init()
rank = dist.get_rank()
marks = pathlib.Path(os.environ["SHMDIST_TEST_DIR"])


def wait_for(*names):
    deadline = time.monotonic() + 120  # bounds a broken run; not a measure of anything
    while not all((marks / n).exists() for n in names):
        if time.monotonic() > deadline:
            raise RuntimeError(f"rank {rank}: {names} never appeared")
        time.sleep(0.01)


dist.barrier()  # 1: everybody
if rank != 2:
    try:
        dist.barrier()  # 2: without rank 2
        say(f"NOT RAISED rank={rank}")
    except RuntimeError as e:
        say(f"CAUGHT rank={rank} {type(e).__name__}: " + str(e).splitlines()[0])
    (marks / f"gave_up_{rank}").touch()
    dist.barrier()  # 3
    say(f"THIRD rank={rank} rank 2 in it: {(marks / 'third_2').exists()}")
else:
    wait_for("gave_up_0", "gave_up_1")
    dist.barrier()  # 2: meets the others' barrier 2
    time.sleep(0.5)  # a barrier 3 returning without rank 2 would return meanwhile
    (marks / "third_2").touch()
    dist.barrier()  # 3
u = torch.full((2,), float(rank + 1))
dist.all_reduce(u)
say(f"AFTER rank={rank} {u.tolist()}")
finish()
