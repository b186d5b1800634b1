"""A rank of a job across emulated hosts (tests/python/test_hosts.py, 2 hosts x 2 ranks) that
trains with DDP, FSDP2 (torch 2's fully_shard) and uses DTensor on a 2-D DeviceMesh (hosts x
ranks of a host), each compared bitwise with a reference this rank computes alone: every
rank's gradients, combined in the order docs/hosts.md documents ((g0 + g1) + (g2 + g3)).
Prints "PASS/FAIL <check> rank=<r>", "SKIP <check> rank=<r>: <why>" and "DONE rank=<r>".
"""

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn

import shmdist.torch  # noqa: F401
from common import TORCH2, expect, expect_equal, run_checks, say

torch.set_num_threads(1)  # the same arithmetic in every process: results compare bit for bit
dist.init_process_group("shm", timeout=timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
HOSTS = [[0, 1], [2, 3]]
WIDTH, BATCH, STEPS, LR = 16, 8, 3, 0.1


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, WIDTH), nn.Tanh(),
                         nn.Linear(WIDTH, 1))


def batch(r, step):
    g = torch.Generator().manual_seed(1000 * step + r)
    x = torch.randn(BATCH, WIDTH, generator=g) * (10.0 ** (r % 3))  # the sum's order shows
    return x, x.sum(dim=1, keepdim=True).sin()


def grads_of(net, r, step):
    net.zero_grad()
    x, y = batch(r, step)
    nn.functional.mse_loss(net(x), y).backward()
    return [p.grad.clone() for p in net.parameters()]


def reference(steps=STEPS):
    """The parameters after `steps` of SGD on the mean of every rank's gradient, summed in the
    documented order and scaled by 1 / world (exact for a world of 4), computed here alone."""
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=LR)  # the same update's arithmetic
    for step in range(steps):
        per_rank = [grads_of(net, r, step) for r in range(world)]
        for i, p in enumerate(net.parameters()):
            acc = None
            for host in HOSTS:
                part = per_rank[host[0]][i]
                for r in host[1:]:
                    part = part + per_rank[r][i]
                acc = part if acc is None else acc + part
            p.grad = acc / world
        opt.step()
    return [p.detach().clone() for p in net.parameters()]


def ddp():
    net = model()
    wrapped = nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(wrapped.parameters(), lr=LR)
    for step in range(STEPS):
        opt.zero_grad()
        x, y = batch(rank, step)
        nn.functional.mse_loss(wrapped(x), y).backward()
        opt.step()
    for got, want in zip(net.parameters(), reference()):
        expect_equal(got.detach(), want, "DDP's parameters against the reference")


def fsdp2():
    if not TORCH2:
        say(f"SKIP fsdp2 rank={rank}: torch {torch.__version__} has no FSDP2 (fully_shard)")
        return
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (world,))
    net = model()
    for layer in net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(net, mesh=mesh)
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    for step in range(STEPS):
        opt.zero_grad()
        x, y = batch(rank, step)
        nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    for got, want in zip(net.parameters(), reference()):
        expect_equal(got.full_tensor().detach(), want, "FSDP2's parameters against the reference")


def dtensor_2d():
    if not TORCH2:
        say(f"SKIP dtensor_2d rank={rank}: torch {torch.__version__} has no DTensor")
        return
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("host", "local"))
    host_group, local_group = mesh.get_group("host"), mesh.get_group("local")
    # The mesh's rows are the hosts: "local" groups stay on one host, "host" groups cross.
    expect(sorted(dist.get_process_group_ranks(local_group)) == HOSTS[rank // 2],
           f"local group {dist.get_process_group_ranks(local_group)}")
    expect(not isinstance(local_group, shmdist.torch.ProcessGroupHosts), repr(local_group))
    expect(sorted(dist.get_process_group_ranks(host_group)) == [rank % 2, rank % 2 + 2],
           f"host group {dist.get_process_group_ranks(host_group)}")
    g = torch.Generator().manual_seed(7)
    a, b = torch.randn(8, 12, generator=g), torch.randn(12, 6, generator=g)
    # Sharded on both dims and gathered back: exact.
    da = distribute_tensor(a, mesh, [Shard(0), Shard(1)])
    expect_equal(da.to_local(), a.chunk(2, 0)[rank // 2].chunk(2, 1)[rank % 2], "local shard")
    expect_equal(da.full_tensor(), a, "full_tensor of a [Shard(0), Shard(1)]")
    # A matmul sharded on the contracted dim over "local": partial sums reduced inside a host,
    # in rank order.
    da = distribute_tensor(a, mesh, [Replicate(), Shard(1)])
    db = distribute_tensor(b, mesh, [Replicate(), Shard(0)])
    dc = torch.matmul(da, db)
    halves = [a.chunk(2, 1)[i] @ b.chunk(2, 0)[i] for i in range(2)]
    expect_equal(dc.full_tensor(), halves[0] + halves[1], "matmul reduced over 'local'")
    # Partial on both dims to Replicate: every rank's value summed, hosts' order documented.
    mine = torch.randn(5, generator=torch.Generator().manual_seed(100 + rank)) * 10.0 ** rank
    from torch.distributed.tensor import DTensor
    dp = DTensor.from_local(mine, mesh, [Partial(), Partial()])
    got = dp.redistribute(mesh, [Replicate(), Replicate()]).to_local()
    vals = [torch.randn(5, generator=torch.Generator().manual_seed(100 + r)) * 10.0 ** r
            for r in range(world)]
    # torch's redistribute reduces mesh dim 0 ("host": ranks i and i + 2, over a group across
    # hosts) first, then dim 1 ("local", over a host's "shm" group): (v0 + v2) + (v1 + v3),
    # each pair in rank order.
    expect_equal(got, (vals[0] + vals[2]) + (vals[1] + vals[3]), "Partial to Replicate")
    # Partial to Shard over "host": a reduce_scatter across hosts.
    ds = DTensor.from_local(mine.repeat(2), mesh, [Partial(), Replicate()])
    got = ds.redistribute(mesh, [Shard(0), Replicate()]).to_local()
    pair = [vals[rank % 2].repeat(2), vals[rank % 2 + 2].repeat(2)]
    expect_equal(got, (pair[0] + pair[1]).chunk(2)[rank // 2], "Partial to Shard over 'host'")


def ddp_powersgd():
    """DDP with the PowerSGD comm hook (torch's powerSGD_hook, rank 1, compression from the
    third step): its future callbacks post another all_reduce and wait for it, which the group
    runs because futures complete on a thread of their own. Prints the parameters' digest
    (compared across ranks by the test: bitwise equal on every rank)."""
    import hashlib
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
    net = model()
    start = [p.detach().clone() for p in net.parameters()]
    wrapped = nn.parallel.DistributedDataParallel(net)
    state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                   start_powerSGD_iter=2, min_compression_rate=0.5)
    wrapped.register_comm_hook(state, powersgd.powerSGD_hook)
    opt = torch.optim.SGD(wrapped.parameters(), lr=LR)
    for step in range(5):
        opt.zero_grad()
        x, y = batch(rank, step)
        nn.functional.mse_loss(wrapped(x), y).backward()
        opt.step()
    params = [p.detach() for p in net.parameters()]
    expect(all(bool(torch.isfinite(p).all()) for p in params), "finite parameters")
    expect(any(not torch.equal(p, q) for p, q in zip(params, start)), "parameters moved")
    expect(state.iter > state.start_powerSGD_iter, f"PowerSGD ran (iter {state.iter})")
    digest = hashlib.sha256(b"".join(p.contiguous().numpy().tobytes() for p in params))
    say(f"DIGEST {rank} {digest.hexdigest()}")


if len(sys.argv) > 1 and sys.argv[1] == "powersgd":
    run_checks([ddp_powersgd])
else:
    run_checks([ddp, fsdp2, dtensor_2d])
dist.barrier()
dist.destroy_process_group()
say(f"DONE rank={rank}")
sys.exit(0)
