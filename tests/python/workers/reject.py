"""Rank 0 passes all_reduce a tensor the backend refuses itself (sparse: shmdist carries dense
tensors only), rank 1 a valid one. Rank 1 must fail at once naming rank 0, not wait for a call
that never comes; rank 0 gets the refusal; the group stays usable for both."""

import time

import torch
import torch.distributed as dist

from common import finish, init, say

init()  # SHMDIST_TEST_TIMEOUT_S: the group's timeout, which the refusal must beat
rank = dist.get_rank()
t = torch.ones(4)
if rank == 0:
    t = t.to_sparse()
t0 = time.monotonic()
try:
    dist.all_reduce(t)
    say(f"NOT RAISED rank={rank}")
except RuntimeError as e:
    say(f"CAUGHT rank={rank} {type(e).__name__} after {time.monotonic() - t0:.1f}s: "
        + str(e).splitlines()[0])
u = torch.full((2,), float(rank + 1))
dist.all_reduce(u)
say(f"AFTER rank={rank} {u.tolist()}")
finish()
