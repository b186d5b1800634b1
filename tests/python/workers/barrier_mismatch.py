"""Issue 27.2 and 27.4: barrier and monitored_barrier are checked like every collective. Rank 0
calls barrier while rank 1 calls all_reduce, then monitored_barrier while rank 1 calls
barrier, on the world group and on a sub-group: both ranks must raise InvalidArgument naming
both calls (not wait for the group's timeout, SHMDIST_TEST_TIMEOUT_S), and the calls after
that must pair as they should ([3.0]x4 from 1 + 2)."""

from datetime import timedelta

import torch
import torch.distributed as dist

from common import finish, init, say

init()
rank = dist.get_rank()
sub = dist.new_group([0, 1])
patient = timedelta(seconds=60)
for label, group in (("world", None), ("sub", sub)):
    cases = (
        ("barrier", lambda g: dist.barrier(group=g),
         lambda g: dist.all_reduce(torch.ones(4), group=g)),
        ("monitored", lambda g: dist.monitored_barrier(group=g, timeout=patient),
         lambda g: dist.barrier(group=g)),
    )
    for case, odd, usual in cases:
        try:
            odd(group) if rank == 0 else usual(group)
            say(f"NOT RAISED {label}/{case} rank={rank}")
        except RuntimeError as e:
            say(f"CAUGHT {label}/{case} rank={rank} {type(e).__name__}: " + str(e).splitlines()[0])
        for k in range(2):
            u = torch.full((4,), float(rank + 1))
            dist.all_reduce(u, group=group)
            say(f"AFTER {label}/{case}/{k} rank={rank} {u.tolist()}")
            dist.barrier(group=group)
finish()
