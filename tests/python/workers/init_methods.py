"""One all_reduce and one send/recv after init_process_group with the method in
SHMDIST_TEST_INIT (env://, tcp://..., file://...)."""

import torch
import torch.distributed as dist

from common import init, finish, say

init()
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.ones(3)
dist.all_reduce(t)
assert torch.equal(t, torch.full((3,), float(world))), t
if rank == 0:
    dist.send(torch.tensor([42]), dst=1)
elif rank == 1:
    res = torch.zeros(1, dtype=torch.long)
    assert dist.recv(res, src=0) == 0 and res.item() == 42
say(f"OK rank={rank} backend={dist.get_backend()}")
finish()
