"""Rank 1 dies (exit code 7) while rank 0 waits for it: rank 0's call raises PeerFailure
(a RuntimeError) naming rank 1, within about a second."""

import os
import sys
import time

import torch
import torch.distributed as dist

from common import init

init()
rank = dist.get_rank()
dist.barrier()
if rank == 1:
    os._exit(7)
if rank == 0:
    t0 = time.monotonic()
    try:
        dist.recv(torch.zeros(1), src=1)
        print("NOT RAISED", flush=True)
    except RuntimeError as e:
        print(f"CAUGHT {type(e).__name__} after {time.monotonic() - t0:.1f}s: {e}", flush=True)
    sys.stdout.flush()
    os._exit(0)
time.sleep(30)  # other ranks: stopped by the launcher
