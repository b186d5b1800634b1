"""Issue 27.12: a coalesced call (argv[1]: "all_reduce_coalesced", or "manager": two
all_reduce calls inside torch 2.x's coalescing manager) whose tensors the backend refuses on
rank 0 (a dtype shmdist does not carry: quantized on torch 1.13, uint32 on 2.x, where the
dispatcher stops quantized tensors itself), valid on rank 1. Rank 1 must fail at once naming
rank 0, not wait out the group's timeout; rank 0 gets the refusal; the group stays usable."""

import sys
import time

import torch
import torch.distributed as dist

from common import TORCH2, finish, init, say

init()  # SHMDIST_TEST_TIMEOUT_S: the group's timeout, which the refusal must beat
rank = dist.get_rank()


def refused():
    if TORCH2:
        return torch.ones(3, dtype=torch.uint32)
    return torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.quint8)


tensors = [refused(), refused()] if rank == 0 else [torch.ones(3), torch.ones(3)]
t0 = time.monotonic()
try:
    if sys.argv[1] == "manager":
        from torch.distributed.distributed_c10d import _coalescing_manager
        with _coalescing_manager():
            for t in tensors:
                dist.all_reduce(t)
    else:
        dist.all_reduce_coalesced(tensors)
    say(f"NOT RAISED rank={rank}")
except RuntimeError as e:
    say(f"CAUGHT rank={rank} {type(e).__name__} after {time.monotonic() - t0:.1f}s: "
        + str(e).splitlines()[0])
u = torch.full((2,), float(rank + 1))
dist.all_reduce(u)
say(f"AFTER rank={rank} {u.tolist()}")
finish()
