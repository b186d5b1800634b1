"""Rank VICTIM (an argument) is SIGKILLed inside init_process_group, after it joined the shm
job and before torch's store-based barrier (torch 1.13 and 2.0 end init_process_group with
one; where torch has none, the victim dies right after init_process_group). The other rank
must raise PeerFailure naming the victim within about a second, not wait in that barrier
until the init timeout. Rank 0 hosts torch's store: its death also breaks the store."""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from common import init

rank = int(os.environ["RANK"])
victim = int(sys.argv[1])


def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)


if rank == victim:
    c10d._store_based_barrier = die  # shmdist.torch (imported by init) wraps it: still dies
t0 = time.monotonic()
try:
    init()
    if rank == victim:
        die()
    dist.barrier()
    print("NOT RAISED", flush=True)
except RuntimeError as e:
    print(f"CAUGHT {type(e).__name__} after {time.monotonic() - t0:.1f}s: {e}", flush=True)
sys.stdout.flush()
os._exit(0)
