"""Issue 27.11: three rounds of init_process_group, all_reduce on the world and on a
sub-group, destroy_process_group, as the C++ API does them under shmrun (tests/hostile).
Round 1 joins through env:// (shmrun's segment); rounds 2 and 3 through a fresh file://
store each (argv[1]: a directory of this job's): torch's store over the same MASTER_PORT,
re-created at once by rank 0, is not reliably ready for the others (torch 1.13: "Broken
pipe"), whatever the backend."""

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

import shmdist.torch  # noqa: F401
from common import say

for round_ in (1, 2, 3):
    if round_ == 1:
        dist.init_process_group(backend="shm", timeout=timedelta(seconds=60))
    else:
        dist.init_process_group(backend="shm", init_method=f"file://{sys.argv[1]}/round{round_}",
                                rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]),
                                timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    t = torch.full((3,), float((rank + 1) * round_))
    dist.all_reduce(t)
    pair = dist.new_group([0, 1])
    dist.all_reduce(t, group=pair)
    say(f"ROUND {round_} rank={rank} sum={t[0].item():g}")
    del pair  # a group object holds its store, as gloo's do
    dist.destroy_process_group()
