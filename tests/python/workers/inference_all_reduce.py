"""shmdist.torch.inference_all_reduce: dist.all_reduce in place without torch's Python layer.
Its result equals dist.all_reduce's bit for bit (float dtypes with rounding, every reduction
dist.all_reduce accepts, the world and a sub-group, a size the ring streams in pieces); it is
the same collective (one rank may call dist.all_reduce against it, a disagreeing call fails
on both); the GIL is released while it waits; and it refuses a non-contiguous tensor, a
group of another backend and a non-group with shmdist.InvalidArgument naming the global rank,
failing the peer's matching call at once.

    inference_all_reduce.py   (2 ranks, env://; prints PASS/FAIL lines)
"""

import threading
import time

import torch
import torch.distributed as dist

import shmdist
import shmdist.torch
from shmdist.torch import inference_all_reduce
from common import TORCH2, expect, expect_equal, expect_raises, finish, init, run_checks, say

init()
me = dist.get_rank()
sub = dist.new_group([0, 1])
gloo = dist.new_group([0, 1], backend="gloo")
OPS = [dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN,
       dist.ReduceOp.MAX]


def bits(t):
    return t.reshape(-1).view(torch.uint8)


def same_as_dist_all_reduce():
    gen = torch.Generator().manual_seed(1234 + me)
    for group in (None, sub):
        for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
            for n in (1000, 300_000):  # the larger one goes through the ring in pieces
                x = (torch.randn(n, generator=gen, dtype=torch.float64) * 3).to(dtype)
                for op in OPS:
                    expected = x.clone()
                    dist.all_reduce(expected, op=op, group=group)
                    got = x.clone()
                    back = inference_all_reduce(got, op=op, group=group)
                    expect(back is got, "returns the tensor it reduced in place")
                    expect(torch.equal(bits(got), bits(expected)),
                           f"{dtype} n={n} op={op} group={group}: bit for bit")
    for dtype in (torch.int64, torch.int32, torch.uint8, torch.bool, torch.complex64):
        x = (torch.arange(24) * (me + 2) % 7).to(dtype).reshape(2, 3, 4)
        expected = x.clone()
        dist.all_reduce(expected)
        expect_equal(inference_all_reduce(x.clone()), expected, f"{dtype} SUM, default op")


def same_collective_as_dist_all_reduce():
    t = torch.full((4096,), float(me + 1))
    if me == 0:
        inference_all_reduce(t)
    else:
        dist.all_reduce(t)
    expect_equal(t, torch.full((4096,), 3.0), "one rank direct, the other dist.all_reduce")
    bad = torch.ones(5 + me)  # another element count on each rank
    expect_raises("", lambda: inference_all_reduce(bad))
    ok = torch.ones(3)
    inference_all_reduce(ok)  # the group goes on
    expect_equal(ok, torch.full((3,), 2.0), "after the mismatch")


def releases_the_gil():
    turns, stop = [0], threading.Event()

    def other():
        while not stop.is_set():
            turns[0] += 1
            time.sleep(0.001)
    t = torch.ones(16)
    side = threading.Thread(target=other)
    side.start()
    if me == 1:
        time.sleep(0.5)  # rank 0 waits inside the call meanwhile
    before = turns[0]
    inference_all_reduce(t)
    during = turns[0] - before
    stop.set()
    side.join()
    expect_equal(t, torch.full((16,), 2.0), "result")
    if me == 0:
        expect(during > 0, "another Python thread ran while the call waited (GIL released)")


def refusals():
    # Non-contiguous on both ranks: each refuses its own, naming itself.
    y = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()
    e = expect_raises("expects a contiguous tensor, found a non-contiguous tensor",
                      lambda: inference_all_reduce(y))
    expect(isinstance(e, shmdist.InvalidArgument), f"InvalidArgument, got {type(e)}")
    expect(f"on rank {me}" in str(e), str(e))
    expect_equal(y, torch.arange(12, dtype=torch.float32).reshape(3, 4).t(), "left untouched")
    # On rank 0 only: rank 1's valid call fails at once naming rank 0.
    z = torch.ones(4, 2)[:, 0] if me == 0 else torch.ones(4)
    e = expect_raises("", lambda: inference_all_reduce(z))
    expect(isinstance(e, shmdist.InvalidArgument), f"InvalidArgument, got {type(e)}: {e}")
    expect(("non-contiguous" in str(e) and "on rank 0" in str(e)) if me == 0 else
           ("global rank 0" in str(e) and "rejected its arguments" in str(e)), str(e))
    # A group of another backend, and something that is not a group.
    e = expect_raises("expected a group of backend 'shm'", lambda: inference_all_reduce(
        torch.ones(2), group=gloo))
    expect(isinstance(e, shmdist.InvalidArgument) and "found a group of backend 'gloo'" in str(e)
           and f"on rank {me}" in str(e), str(e))
    e = expect_raises("expected a torch.distributed process group", lambda: inference_all_reduce(
        torch.ones(2), group="world"))
    expect(isinstance(e, shmdist.InvalidArgument) and f"on rank {me}" in str(e), str(e))
    e = expect_raises("expected a torch.distributed.ReduceOp", lambda: inference_all_reduce(
        torch.ones(2), op="sum"))
    expect(isinstance(e, shmdist.InvalidArgument) and f"on rank {me}" in str(e), str(e))
    # A ReduceOp object (torch 2.x: not only its RedOpType values) is taken too.
    v = torch.full((2,), float(me + 1))
    inference_all_reduce(v, op=dist.ReduceOp(dist.ReduceOp.MAX) if TORCH2 else dist.ReduceOp.MAX)
    expect_equal(v, torch.full((2,), 2.0), "op given as a ReduceOp object")
    w = torch.full((2,), float(me + 1))
    inference_all_reduce(w)  # usable after the refusals
    expect_equal(w, torch.full((2,), 3.0), "after the refusals")


run_checks([same_as_dist_all_reduce, same_collective_as_dist_all_reduce, releases_the_gil,
            refusals])
say(f"DONE rank={me}")
finish()
