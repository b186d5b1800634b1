"""Under TORCH_DISTRIBUTED_DEBUG=DETAIL (set by the test): torch 2.x wraps every group of a
plugin backend in its ProcessGroupWrapper, which compares each collective's kind, shapes and
the group's sequence number across ranks before running it. Collectives on the world and on a
sub-group work through it, and mismatched collectives raise its RuntimeError instead of
hanging or corrupting. (torch 1.13 does not wrap plugin backends: the same calls just work.)"""

import torch
import torch.distributed as dist

from common import TORCH2, backend_of, expect, expect_equal, expect_raises, finish, init, run_checks

init()
rank, world = dist.get_rank(), dist.get_world_size()
sub = dist.new_group(list(range(world)))


def collectives_through_the_wrapper():
    for group in (None, sub):
        t = torch.full((4,), float(rank + 1))
        dist.all_reduce(t, group=group)
        expect_equal(t, torch.full((4,), float(world * (world + 1) // 2)), "all_reduce")
        b = torch.full((2,), float(rank))
        dist.broadcast(b, src=0, group=group)
        expect_equal(b, torch.zeros(2), "broadcast")
        dist.barrier(group=group)


def sequence_numbers_count_collectives():
    shm = backend_of(sub)
    before = shm._get_sequence_number_for_group()
    dist.all_reduce(torch.ones(1), group=sub)
    dist.barrier(group=sub)
    expect(shm._get_sequence_number_for_group() == before + 2,
           f"2 collectives after {before}: {shm._get_sequence_number_for_group()}")


def mismatched_collectives_are_reported():
    if not TORCH2:
        return
    t = torch.ones(3)
    if rank == 0:
        expect_raises("mismatch", lambda: dist.all_reduce(t))
    else:
        expect_raises("mismatch", lambda: dist.broadcast(t, src=0))
    dist.barrier()  # still usable afterwards


run_checks([collectives_through_the_wrapper, sequence_numbers_count_collectives,
            mismatched_collectives_are_reported])
print(f"DONE rank={rank}", flush=True)
finish()
