"""torch 2.x tells a backend whether its caller waits at once (AllreduceOptions.asyncOp):
"shm" then runs the all_reduce blocking inside the call and returns a completed Work.
Rank 1 makes its call late; rank 0's call with asyncOp=False returns only once the result
is there (the Work complete, the tensor reduced, before any wait()), and its call with
asyncOp=True returns at once with a Work that completes on wait(). dist.all_reduce (which
passes async_op) gives the same results, a non-contiguous tensor included (a staging copy
written back on wait()), and a call that disagrees with its peer's fails on both ranks.

    blocking.py   (2 ranks, env://; prints PASS/FAIL lines)
"""

import threading
import time

import torch
import torch.distributed as dist

from common import expect, expect_equal, expect_raises, finish, init, say

init()
me = dist.get_rank()
group = dist.distributed_c10d._get_default_group()
LATE = 0.5  # seconds rank 1 waits before each of its calls: rank 0 is then surely ahead


def call(async_op):
    """Also counts the turns another Python thread takes during the call: a call that
    blocks must let it run (the GIL released while it waits)."""
    t = torch.full((1000,), float(me + 1))
    if me == 1:
        time.sleep(LATE)
    opts = dist.AllreduceOptions()
    opts.asyncOp = async_op
    turns, inside = [0], threading.Event()
    stop = threading.Event()

    def other():
        inside.wait()
        while not stop.is_set():
            turns[0] += 1
            time.sleep(0.001)
    side = threading.Thread(target=other)
    side.start()
    inside.set()
    work = group.allreduce([t], opts)
    during = turns[0]
    stop.set()
    side.join()
    done_at_return = work.is_completed()
    reduced_at_return = bool((t == 3).all())
    work.wait()
    return done_at_return, reduced_at_return, t, during


try:
    done, reduced, t, during = call(False)
    if me == 0:
        expect(done and reduced, f"asyncOp=False: the Work was complete ({done}) and the tensor "
               f"reduced ({reduced}) when allreduce returned")
        expect(during > 0, "another Python thread ran while allreduce blocked (GIL released)")
    expect_equal(t, torch.full((1000,), 3.0), "asyncOp=False result")
    done, _, t, _ = call(True)
    if me == 0:
        expect(not done, "asyncOp=True: the Work was still pending when allreduce returned "
               "(the peer had not called yet)")
    expect_equal(t, torch.full((1000,), 3.0), "asyncOp=True result")
    # dist.all_reduce: contiguous, then a non-contiguous view (staged, copied back on wait()).
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4) * (me + 1)
    dist.all_reduce(x)
    expect_equal(x, torch.arange(12, dtype=torch.float32).reshape(3, 4) * 3, "dist.all_reduce")
    y = (torch.arange(12, dtype=torch.bfloat16).reshape(3, 4) * (me + 1)).t()
    dist.all_reduce(y)
    expect_equal(y, (torch.arange(12, dtype=torch.bfloat16).reshape(3, 4) * 3).t(),
                 "dist.all_reduce, non-contiguous")
    # Disagreeing calls (another element count) fail on both ranks, from dist.all_reduce.
    bad = torch.ones(5 + me)
    expect_raises("", lambda: dist.all_reduce(bad))
    z = torch.ones(4)
    dist.all_reduce(z)  # the group goes on
    expect_equal(z, torch.full((4,), 2.0), "all_reduce after the mismatch")
    say(f"PASS blocking rank={me}")
except AssertionError as e:
    say(f"FAIL blocking rank={me}: {e}")
finish()
