"""Rank 1 dies (exit code 7) while rank 0 waits for it: rank 0's call raises PeerFailure
(a RuntimeError) naming rank 1, within about a second."""

import os
import sys
import time

import torch
import torch.distributed as dist

from common import init, say

init()
rank = dist.get_rank()
dist.barrier()
if rank == 1:
    os._exit(7)
if rank == 0:
    t0 = time.monotonic()
    try:
        dist.recv(torch.zeros(1), src=1)
        say("NOT RAISED")
    except RuntimeError as e:
        say(f"CAUGHT {type(e).__name__} after {time.monotonic() - t0:.1f}s: {e}")
    sys.stdout.flush()
    os._exit(0)
time.sleep(30)  # other ranks: stopped by the launcher
