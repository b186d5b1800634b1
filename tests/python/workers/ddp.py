"""DistributedDataParallel training on backend shm or gloo (argv[1]), the same model, data
and seeds on either: prints, per rank, every step's loss (exactly, as float.hex) and a digest
of the parameters' bytes after training, so the test can compare ranks (bitwise equal
parameters) and backends (equal losses). With --time it prints the median step time instead
(bench/torch/ddp_step.py).

    ddp.py BACKEND [--steps N] [--width W] [--time] [--no-sync]

--no-sync runs every step inside DDP's no_sync(): no gradient all-reduce at all (each rank
keeps its own gradients), the floor of a step that no backend can beat (bench/torch/ddp_step.py
times it beside the backends; the ranks' parameters then differ).
"""

import argparse
import contextlib
import hashlib
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

from common import say  # one write(2) a line: the ranks share one pipe

parser = argparse.ArgumentParser()
parser.add_argument("backend", choices=["shm", "gloo"])
parser.add_argument("--steps", type=int, default=8)
parser.add_argument("--width", type=int, default=64)
parser.add_argument("--depth", type=int, default=3)
parser.add_argument("--batch", type=int, default=16)
parser.add_argument("--time", action="store_true")
parser.add_argument("--no-sync", action="store_true")
args = parser.parse_args()

torch.set_num_threads(1)  # the same arithmetic in every run: results compare bit for bit
if args.backend == "shm":
    import shmdist.torch  # noqa: F401
dist.init_process_group(args.backend)
rank, world = dist.get_rank(), dist.get_world_size()

torch.manual_seed(0)  # the same initial model on every rank (DDP broadcasts rank 0's anyway)
layers = []
for _ in range(args.depth):
    layers += [nn.Linear(args.width, args.width), nn.Tanh()]
model = nn.Sequential(*layers, nn.Linear(args.width, 1))
ddp = nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)

data = torch.Generator().manual_seed(1000 + rank)  # each rank its own shard of the data
times, losses = [], []
for step in range(args.steps):
    x = torch.randn(args.batch, args.width, generator=data)
    y = x.sum(dim=1, keepdim=True).sin()
    start = time.perf_counter()
    opt.zero_grad()
    with ddp.no_sync() if args.no_sync else contextlib.nullcontext():
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()  # DDP all-reduces the gradients here (not under no_sync)
    opt.step()
    times.append(time.perf_counter() - start)
    # The global loss, as a training loop would log it.
    total = loss.detach().clone()
    dist.all_reduce(total)
    losses.append(total.item() / world)

digest = hashlib.sha256()
for p in model.parameters():
    digest.update(bytes(p.detach().contiguous().view(torch.uint8).flatten().tolist()))
params = sum(p.numel() for p in model.parameters())
if args.time:
    warm = times[len(times) // 4:] or times
    say(f"STEP rank={rank} backend={args.backend} no_sync={int(args.no_sync)} params={params} "
        f"median_ms={1e3 * statistics.median(warm):.3f}")
else:
    say(f"LOSSES rank={rank} " + " ".join(float(l).hex() for l in losses))
say(f"PARAMS rank={rank} {digest.hexdigest()}")
dist.destroy_process_group()
if args.backend == "gloo":
    # The reference run only. torch 2.13's gloo with DDP aborts in the interpreter's teardown,
    # after destroy_process_group has returned and everything above is printed, in about 1
    # process of 6 on this machine type ("terminate called without an active exception":
    # a std::thread of torch's destroyed while joinable; the same script with os._exit here
    # never did in 40). That is torch's, not the backend under test, so gloo's run leaves
    # without the teardown; "shm"'s run goes through it, so a crash of ours there still fails.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
