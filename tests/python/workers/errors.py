"""What the backend refuses, and how: RuntimeErrors that say why. 2 ranks or more."""

import time
from datetime import timedelta

import torch
import torch.distributed as dist

from common import TORCH2, backend_of, expect, expect_raises, finish, init, run_checks, say

init()
RANK = dist.get_rank()
PEER = 1 - RANK if RANK < 2 else 0


def non_cpu_tensors_are_refused():
    # No CUDA here, and torch's dispatcher sends other devices' tensors elsewhere before
    # they reach a backend: a meta tensor, checked as every operation checks its tensors,
    # stands for a CUDA one.
    from shmdist import _C
    expect_raises("CPU tensors only, got a tensor on meta", lambda: _C._check_tensor(torch.empty(3, device="meta"), "send"))


def sparse_tensors_are_refused():
    t = torch.zeros(3).to_sparse()
    from shmdist import _C
    # The backend's own check, which every operation makes first...
    expect_raises("sparse", lambda: _C._check_tensor(t, "broadcast"))
    # ...and what a user sees: torch 2.x's dispatcher refuses a sparse broadcast itself
    # (no kernel for SparseCPU), and hands a sparse all_reduce to allreduce_sparse.
    expect_raises("SparseCPU" if TORCH2 else "sparse", lambda: dist.broadcast(t, src=0))
    expect_raises("sparse", lambda: dist.all_reduce(t))


def quantized_tensors_are_refused():
    t = torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.quint8)
    from shmdist import _C
    expect_raises("does not support tensors of dtype", lambda: _C._check_tensor(t, "all_reduce"))
    # torch 2.x's dispatcher has no QuantizedCPU kernel for c10d's operations.
    expect_raises("QuantizedCPU" if TORCH2 else "does not support tensors of dtype",
                  lambda: dist.all_reduce(t))


def shmdist_errors_are_runtime_errors():
    import shmdist
    if TORCH2:
        # torch 2.x refuses a send to oneself in Python (a ValueError); the backend's own
        # check is reached through the backend object.
        try:
            dist.send(torch.zeros(1), dst=RANK)
            raise AssertionError("dist.send to this rank raised nothing")
        except ValueError as e:
            expect("should not be the same as the rank" in str(e), f"torch's ValueError, got {e}")
        e = expect_raises("this rank itself", lambda: backend_of().send([torch.zeros(1)], RANK, 0))
    else:
        e = expect_raises("this rank itself", lambda: dist.send(torch.zeros(1), dst=RANK))
    expect(isinstance(e, shmdist.InvalidArgument), f"shmdist.InvalidArgument, got {type(e)}")
    # Issue 27.13: a peer outside the group is refused as shmdist refuses (before: a plain
    # RuntimeError), naming this rank and the rank given.
    outside = dist.get_world_size() + 3
    for call in (lambda: dist.send(torch.zeros(1), dst=outside),
                 lambda: dist.recv(torch.zeros(1), src=outside),
                 lambda: dist.isend(torch.zeros(1), dst=outside).wait()):
        e = expect_raises("not in the group", call)
        expect(isinstance(e, shmdist.InvalidArgument), f"shmdist.InvalidArgument, got {type(e)}")
        expect(f"on rank {RANK}: group rank {outside} is not in the group of "
               f"{dist.get_world_size()} ranks" in str(e), f"names both ranks: {e}")
    # A tensor the backend cannot carry, sent point to point: InvalidArgument too.
    if not TORCH2:  # torch 2.x's dispatcher refuses a quantized send itself
        t = torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.quint8)
        e = expect_raises("does not support tensors of dtype", lambda: dist.send(t, dst=PEER))
        expect(isinstance(e, shmdist.InvalidArgument), f"shmdist.InvalidArgument, got {type(e)}")


def mismatched_collectives_raise_on_every_rank():
    t = torch.zeros(3 if RANK == 0 else 4)
    expect_raises("", lambda: dist.all_reduce(t))
    u = torch.ones(2)
    dist.all_reduce(u)  # the group stays usable
    expect(torch.equal(u, torch.full((2,), float(dist.get_world_size()))), f"then all_reduce gave {u}")


def a_receive_times_out():
    import shmdist
    if RANK == 0:
        t0 = time.monotonic()
        e = expect_raises("timed out", lambda: dist.recv(torch.zeros(1), src=1, tag=77))
        expect(isinstance(e, shmdist.Timeout), f"shmdist.Timeout, got {type(e)}")
        expect(time.monotonic() - t0 < 60, "within the group's timeout")
        dist.send(torch.zeros(1), dst=1, tag=78)
    elif RANK == 1:
        # Wait (longer than the group's timeout) until rank 0's receive has timed out.
        dist.irecv(torch.zeros(1), src=0, tag=78).wait(timedelta(seconds=60))
        dist.send(torch.zeros(1), dst=0, tag=77)  # what the timed-out receive waited for


def a_wait_with_its_own_timeout_leaves_the_work_pending():
    import shmdist
    if RANK == 0:
        work = dist.irecv(res := torch.zeros(1), src=1, tag=90)
        e = expect_raises("did not complete", lambda: work.wait(timedelta(milliseconds=50)))
        # Issue 27.13: an expiry is shmdist.Timeout (before: a plain RuntimeError), naming
        # this rank and the limit.
        expect(isinstance(e, shmdist.Timeout), f"shmdist.Timeout, got {type(e)}: {e}")
        expect("on rank 0 did not complete within the 50 ms given to wait()" in str(e),
               f"names the rank and the limit: {e}")
        dist.send(torch.zeros(1), dst=1, tag=91)
        work.wait()
        expect(res.item() == 5.0, f"then received {res}")
    elif RANK == 1:
        dist.recv(torch.zeros(1), src=0, tag=91)
        dist.send(torch.full((1,), 5.0), dst=0, tag=90)


def list_entries_of_another_shape_are_refused():
    """Issue 27.8: outputs with the input's element count but another shape are refused, as
    gloo refuses them, on the rank that passed them (naming it and both shapes); the others
    fail at once naming it; nothing is written; the group goes on."""
    import shmdist
    n = dist.get_world_size()
    t = torch.full((3, 2), float(RANK + 1))
    out = [torch.zeros((2, 3) if RANK == 1 and j == 0 else (3, 2)) for j in range(n)]
    e = expect_raises("", lambda: dist.all_gather(out, t))
    expect(isinstance(e, shmdist.InvalidArgument), f"shmdist.InvalidArgument, got {type(e)}: {e}")
    if RANK == 1:
        expect("on rank 1, tensor_list[0] has shape (2, 3)" in str(e) and
               "invalid tensor size at index 0 (expected (3, 2), got (2, 3))" in str(e),
               f"names the rank and both shapes: {e}")
    else:
        expect("group rank 1" in str(e) and "rejected its arguments" in str(e),
               f"names rank 1: {e}")
    expect(all(torch.equal(o, torch.zeros_like(o)) for o in out), f"nothing written: {out}")
    if RANK == 0:  # gather: the root's list
        bad = [torch.zeros(6)] + [torch.zeros(3, 2) for _ in range(n - 1)]
        e = expect_raises("invalid tensor size at index 0 (expected (3, 2), got (6,))",
                          lambda: dist.gather(t, bad, dst=0))
    else:
        e = expect_raises("group rank 0", lambda: dist.gather(t, dst=0))
    expect(isinstance(e, shmdist.InvalidArgument), f"shmdist.InvalidArgument, got {type(e)}: {e}")
    good = [torch.zeros(3, 2) for _ in range(n)]
    dist.all_gather(good, t)
    expect(all(torch.equal(good[j], torch.full((3, 2), float(j + 1))) for j in range(n)),
           f"then all_gather gave {good}")


def a_monitored_barrier_with_timeout_zero_expires_at_once():
    # A group of its own: the other members never call it, so nothing else is thrown off.
    # Read as "unset", a zero timeout would be this group's 5 s (the message names the limit).
    group = dist.new_group(list(range(dist.get_world_size())), timeout=timedelta(seconds=5))
    if RANK == 0:
        expect_raises("not arrived within 0 ms",
                      lambda: dist.monitored_barrier(group, timeout=timedelta(0)))
        expect_raises("not arrived within 0 ms", lambda: group.monitored_barrier(timedelta(0)))


run_checks([non_cpu_tensors_are_refused, sparse_tensors_are_refused, quantized_tensors_are_refused,
            shmdist_errors_are_runtime_errors, mismatched_collectives_raise_on_every_rank,
            list_entries_of_another_shape_are_refused,
            a_receive_times_out, a_wait_with_its_own_timeout_leaves_the_work_pending,
            a_monitored_barrier_with_timeout_zero_expires_at_once])
dist.barrier()
say(f"DONE rank={RANK}")
# The timed-out receive was matched later (tag 77); nothing is left unreceived.
finish()
