"""Initialises, says READY, then waits to be killed (for the kill -9 leftovers test)."""

import time

import torch.distributed as dist

from common import init, say

init()
say(f"READY rank={dist.get_rank()}")
time.sleep(120)
