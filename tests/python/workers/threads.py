"""Two Python threads per rank, each calling collectives on its own group; both groups are
ranks [0, 1] (issue 27.1). Rank 0 starts its group-A thread first, rank 1 its group-B thread
first, so each rank's first call waits for a call its peer makes from its other thread. Then
a call that its peer does not make (yet) times out after its group's timeout while the other
thread's group keeps working, and the late call completes it. Prints PASS/FAIL lines and
"TIMEOUT rank=0 <type>: <message>"."""

import threading
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

from common import finish, init, say

init()  # SHMDIST_TEST_TIMEOUT_S: the groups' timeout
rank = dist.get_rank()
peer = 1 - rank
group_a = dist.new_group([0, 1])
group_b = dist.new_group([0, 1])
short = dist.new_group([0, 1], timeout=timedelta(seconds=3))
other = dist.new_group([0, 1])


def traffic(group, rounds, salt):
    """`rounds` all_reduces (and a barrier and an exchange now and then) on `group`, checked;
    `salt` tells the groups' values apart, so that a call paired across groups would show."""
    for i in range(rounds):
        t = torch.full((4,), salt + i + rank, dtype=torch.float64)
        dist.all_reduce(t, group=group)
        expected = torch.full((4,), 2.0 * (salt + i) + 1, dtype=torch.float64)
        if not torch.equal(t, expected):
            raise AssertionError(f"round {i} on salt {salt}: {t.tolist()} != {expected.tolist()}")
        if i % 20 == 0:
            dist.barrier(group=group)
            out = torch.full((3,), 1000.0 * salt + i + rank)
            got = torch.zeros(3)
            if rank == 0:
                dist.send(out, peer, group=group)
                dist.recv(got, peer, group=group)
            else:
                dist.recv(got, peer, group=group)
                dist.send(out, peer, group=group)
            if not torch.equal(got, torch.full((3,), 1000.0 * salt + i + peer)):
                raise AssertionError(f"exchange {i} on salt {salt}: got {got.tolist()}")


def two_threads(first, second, limit):
    """Runs `first` on a thread and, once it has started, `second` on another. Returns the
    tracebacks of what failed; a thread still running after `limit` seconds counts as hung."""
    errors = []
    started = threading.Event()

    def guarded(fn):
        def body():
            started.set()
            try:
                fn()
            except Exception:  # noqa: BLE001 - reported by the caller
                errors.append(traceback.format_exc().strip().replace("\n", " | "))
        return body

    a = threading.Thread(target=guarded(first), daemon=True)
    a.start()
    started.wait()
    b = threading.Thread(target=guarded(second), daemon=True)
    b.start()
    for t in (a, b):
        t.join(limit)
        if t.is_alive():
            errors.append(f"a thread is still running after {limit} s (hung)")
    return errors


def check(name, errors):
    if errors:
        say(f"FAIL {name} rank={rank}: " + " || ".join(errors))
    else:
        say(f"PASS {name} rank={rank}")
    return not errors


on_a = lambda: traffic(group_a, 200, 1.0)  # noqa: E731
on_b = lambda: traffic(group_b, 200, 5.0)  # noqa: E731
ok = check("two_threads_two_groups",
           two_threads(on_a, on_b, 90) if rank == 0 else two_threads(on_b, on_a, 90))
if ok:
    # Both groups still agree afterwards.
    errors = []
    try:
        traffic(group_a, 2, 9.0)
        traffic(group_b, 2, 11.0)
    except Exception:  # noqa: BLE001
        errors.append(traceback.format_exc().strip().replace("\n", " | "))
    ok = check("groups_agree_after_threads", errors)

if ok:
    if rank == 0:
        def alone():
            t = torch.ones(2)
            try:
                dist.all_reduce(t, group=short)
            except RuntimeError as e:
                say(f"TIMEOUT rank=0 {type(e).__name__}: " + str(e).splitlines()[0])
                return
            raise AssertionError("all_reduce on the short group returned without its peer")
        errors = two_threads(alone, lambda: traffic(other, 50, 3.0), 60)
    else:
        errors = []
        try:
            traffic(other, 50, 3.0)
        except Exception:  # noqa: BLE001
            errors.append(traceback.format_exc().strip().replace("\n", " | "))
    # Rank 1 makes its call only once rank 0's has timed out (rank 0 leaves its threads
    # first): it completes rank 0's pending call, and the group is usable afterwards.
    dist.barrier(group=other)
    try:
        if rank == 1:
            t = torch.ones(2)
            dist.all_reduce(t, group=short)
            if t.tolist() != [2.0, 2.0]:
                raise AssertionError(f"the late all_reduce gave {t.tolist()}")
        traffic(short, 2, 13.0)
    except Exception:  # noqa: BLE001
        errors.append(traceback.format_exc().strip().replace("\n", " | "))
    check("timeout_on_one_group_other_group_runs", errors)

say(f"DONE rank={rank}")
finish()
