"""Every operation of the backend on the world and on sub-groups, checked against values
computed locally. Run under shmrun (or any launcher) with 3 ranks or more; prints one
PASS/FAIL line per check and rank."""

import torch
import torch.distributed as dist

from common import DTYPES, expect, expect_equal, expect_raises, finish, init, members, run_checks, sample, say

init()
RANK = dist.get_rank()
WORLD = dist.get_world_size()
G = None     # the group under test (None: the world)
M = []       # its members' global ranks
ME = -1      # this rank's group rank


def value_of(global_rank, n=4, dtype=torch.float32):
    return (torch.arange(n, dtype=torch.float64) + 10 * global_rank).to(dtype)


# ---- point-to-point ---------------------------------------------------------------------

def send_recv_ring():
    nxt, prv = M[(ME + 1) % len(M)], M[(ME - 1) % len(M)]
    dist.send(value_of(RANK), dst=nxt, group=G)
    res = torch.zeros(4)
    src = dist.recv(res, src=prv, group=G)
    expect(src == prv, f"recv returned {src}, expected global rank {prv}")
    expect_equal(res, value_of(prv))


def any_source_gives_global_ranks():
    if ME == 0:
        seen = set()
        for _ in M[1:]:
            res = torch.zeros(4)
            src = dist.recv(res, src=dist.ANY_SOURCE, group=G)
            expect_equal(res, value_of(src), f"message from {src}")
            seen.add(src)
        expect(seen == set(M[1:]), f"any-source senders {seen}, expected {set(M[1:])}")
    else:
        dist.send(value_of(RANK), dst=M[0], group=G)


def every_dtype_point_to_point():
    for dtype in DTYPES:
        if ME == 0:
            for peer in M[1:]:
                dist.send(sample(dtype, peer), dst=peer, group=G)
        else:
            res = torch.zeros(5, dtype=dtype)
            dist.recv(res, src=M[0], group=G)
            expect_equal(res, sample(dtype, RANK), str(dtype))


def conversion_on_receive():  # the seed's example 3: int64 into float32
    if ME == 0:
        dist.send(torch.tensor([7, 8, 9]), dst=M[1], group=G)
    elif ME == 1:
        res = torch.zeros(3)
        dist.recv(res, src=M[0], group=G)
        expect_equal(res, torch.tensor([7., 8., 9.]))


def non_contiguous_point_to_point():
    if ME == 0:
        t = torch.arange(12, dtype=torch.int32).reshape(3, 4).t()  # a transposed view
        dist.send(t, dst=M[1], group=G)
        dist.send(torch.arange(20.)[::2], dst=M[1], group=G)        # a strided view
    elif ME == 1:
        dst = torch.zeros(3, 4, dtype=torch.int32).t()
        dist.recv(dst, src=M[0], group=G)
        expect_equal(dst, torch.arange(12, dtype=torch.int32).reshape(3, 4).t(), "transposed")
        backing = torch.full((20,), -1.)
        dist.recv(backing[1::2], src=M[0], group=G)
        expect_equal(backing[1::2], torch.arange(20.)[::2], "strided")
        expect_equal(backing[0::2], torch.full((10,), -1.), "the gaps stay untouched")


def async_point_to_point():
    nxt, prv = M[(ME + 1) % len(M)], M[(ME - 1) % len(M)]
    res = torch.zeros(4)
    r = dist.irecv(res, src=prv, group=G)
    s = dist.isend(value_of(RANK), dst=nxt, group=G)
    s.wait()
    r.wait()
    expect(r.is_completed(), "irecv completed after wait")
    expect_equal(res, value_of(prv))
    ops = [dist.P2POp(dist.isend, value_of(RANK, dtype=torch.float64), nxt, G),
           dist.P2POp(dist.irecv, res2 := torch.zeros(4, dtype=torch.float64), prv, G)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    expect_equal(res2, value_of(prv, dtype=torch.float64), "batch_isend_irecv")


def size_mismatch_raises_and_keeps_the_message():
    if ME == 0:
        dist.send(torch.arange(6), dst=M[1], group=G, tag=5)
    elif ME == 1:
        expect_raises("6", lambda: dist.recv(torch.zeros(4, dtype=torch.long), src=M[0], group=G, tag=5))
        res = torch.zeros(6, dtype=torch.long)
        dist.recv(res, src=M[0], group=G, tag=5)
        expect_equal(res, torch.arange(6))


def tags_separate_messages():
    if ME == 0:
        dist.send(torch.tensor([1.]), dst=M[1], group=G, tag=1)
        dist.send(torch.tensor([2.]), dst=M[1], group=G, tag=2)
    elif ME == 1:
        b, a = torch.zeros(1), torch.zeros(1)
        dist.recv(b, src=M[0], group=G, tag=2)
        dist.recv(a, src=M[0], group=G, tag=1)
        expect_equal(a, torch.tensor([1.]))
        expect_equal(b, torch.tensor([2.]))


# ---- collectives ------------------------------------------------------------------------

def contributions(dtype, n=5):
    return [sample(dtype, g, n) for g in M]


def reference(op, values):
    acc = values[0].clone()
    for v in values[1:]:
        if op == dist.ReduceOp.SUM:
            acc = (acc | v) if acc.dtype == torch.bool else acc + v
        elif op == dist.ReduceOp.PRODUCT:
            acc = (acc & v) if acc.dtype == torch.bool else acc * v
        elif op == dist.ReduceOp.MIN:
            acc = torch.minimum(acc, v)
        elif op == dist.ReduceOp.MAX:
            acc = torch.maximum(acc, v)
        elif op == dist.ReduceOp.BAND:
            acc = acc & v
        elif op == dist.ReduceOp.BOR:
            acc = acc | v
        elif op == dist.ReduceOp.BXOR:
            acc = acc ^ v
    return acc


REDUCTIONS = [
    (torch.float32, [dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX]),
    (torch.float64, [dist.ReduceOp.SUM, dist.ReduceOp.MAX]),
    (torch.int64, [dist.ReduceOp.SUM, dist.ReduceOp.MIN, dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR]),
    (torch.int32, [dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT]),
    (torch.int16, [dist.ReduceOp.MAX]), (torch.int8, [dist.ReduceOp.SUM]), (torch.uint8, [dist.ReduceOp.BXOR]),
    (torch.bool, [dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.BAND]),
    (torch.float16, [dist.ReduceOp.SUM]), (torch.bfloat16, [dist.ReduceOp.SUM, dist.ReduceOp.MAX]),
]


def all_reduce_every_dtype_and_op():
    for dtype, ops in REDUCTIONS:
        for op in ops:
            t = sample(dtype, RANK)
            dist.all_reduce(t, op=op, group=G)
            expected = reference(op, contributions(dtype))
            if dtype in (torch.float16, torch.bfloat16):  # accumulated in float32, rounded once
                expected = reference(op, [v.float() for v in contributions(dtype)]).to(dtype)
            expect_equal(t, expected, f"{dtype} {op}")


def all_reduce_avg_and_complex():
    t = sample(torch.float64, RANK)
    dist.all_reduce(t, op=dist.ReduceOp.AVG, group=G)
    expect(torch.allclose(t, sum(contributions(torch.float64)) / len(M)), "AVG")
    c = sample(torch.complex64, RANK)
    dist.all_reduce(c, group=G)
    expect_equal(c, sum(contributions(torch.complex64)[1:], contributions(torch.complex64)[0]), "complex64 SUM")


def all_reduce_non_contiguous():
    base = torch.zeros(4, 6)
    view = base[:, ::2]  # not contiguous
    view.copy_(torch.full((4, 3), float(RANK + 1)))
    dist.all_reduce(view, group=G)
    expect_equal(view, torch.full((4, 3), float(sum(g + 1 for g in M))))
    expect_equal(base[:, 1::2], torch.zeros(4, 3), "the gaps stay untouched")


def broadcast_from_every_root():
    for root_rank in M:
        t = value_of(RANK) if RANK == root_rank else torch.zeros(4)
        dist.broadcast(t, src=root_rank, group=G)
        expect_equal(t, value_of(root_rank), f"root {root_rank}")


def reduce_leaves_other_inputs():
    root = M[-1]
    t = sample(torch.float32, RANK)
    dist.reduce(t, dst=root, group=G)
    expected = reference(dist.ReduceOp.SUM, contributions(torch.float32)) if RANK == root else sample(torch.float32, RANK)
    expect_equal(t, expected)


def all_gather_lists_and_tensor():
    out = [torch.zeros(4) for _ in M]
    dist.all_gather(out, value_of(RANK), group=G)
    for g, o in zip(M, out):
        expect_equal(o, value_of(g), f"from {g}")
    flat = torch.zeros(len(M) * 4)
    dist.all_gather_into_tensor(flat, value_of(RANK), group=G)
    expect_equal(flat, torch.cat([value_of(g) for g in M]), "all_gather_into_tensor")
    flat2 = torch.zeros(len(M) * 4)
    dist._all_gather_base(flat2, value_of(RANK), group=G)
    expect_equal(flat2, flat, "_all_gather_base")


def all_gather_non_contiguous_outputs():
    backing = torch.zeros(len(M), 8)
    out = [backing[i, ::2] for i in range(len(M))]
    dist.all_gather(out, value_of(RANK), group=G)
    for g, o in zip(M, out):
        expect_equal(o, value_of(g), f"from {g}")


def gather_and_scatter():
    root = M[0]
    lst = [torch.zeros(4) for _ in M] if RANK == root else None
    dist.gather(value_of(RANK), gather_list=lst, dst=root, group=G)
    if RANK == root:
        for g, o in zip(M, lst):
            expect_equal(o, value_of(g), f"gather from {g}")
    out = torch.zeros(4)
    dist.scatter(out, scatter_list=[value_of(g) for g in M] if RANK == root else None, src=root, group=G)
    expect_equal(out, value_of(RANK), "scatter")


def reduce_scatter_list_and_tensor():
    inputs = [value_of(RANK) + 100 * i for i in range(len(M))]
    out = torch.zeros(4)
    dist.reduce_scatter(out, inputs, group=G)
    expect_equal(out, sum(value_of(g) + 100 * ME for g in M), "reduce_scatter")
    flat_in = torch.cat(inputs)
    out2 = torch.zeros(4)
    dist.reduce_scatter_tensor(out2, flat_in, group=G)
    expect_equal(out2, out, "reduce_scatter_tensor")
    out3 = torch.zeros(4)
    dist._reduce_scatter_base(out3, flat_in, group=G)
    expect_equal(out3, out, "_reduce_scatter_base")


def all_to_all_lists_and_single():
    inputs = [torch.full((2,), float(100 * RANK + j)) for j in range(len(M))]
    outputs = [torch.zeros(2) for _ in M]
    dist.all_to_all(outputs, inputs, group=G)
    for i, g in enumerate(M):
        expect_equal(outputs[i], torch.full((2,), float(100 * g + ME)), f"all_to_all from {g}")
    single_in = torch.cat(inputs)
    single_out = torch.zeros(2 * len(M))
    dist.all_to_all_single(single_out, single_in, group=G)
    expect_equal(single_out, torch.cat(outputs), "all_to_all_single")
    # Unequal splits: member i sends i+1 rows to everyone.
    in_splits = [ME + 1] * len(M)
    out_splits = [i + 1 for i in range(len(M))]
    src = torch.full((sum(in_splits),), float(RANK))
    dst = torch.zeros(sum(out_splits))
    dist.all_to_all_single(dst, src, out_splits, in_splits, group=G)
    expect_equal(dst, torch.cat([torch.full((i + 1,), float(g)) for i, g in enumerate(M)]), "unequal splits")


def coalesced_forms():
    ts = [sample(torch.float32, RANK), sample(torch.float32, RANK, 3)]
    dist.all_reduce_coalesced(ts, group=G)
    expect_equal(ts[0], reference(dist.ReduceOp.SUM, contributions(torch.float32)), "5 elements")
    expect_equal(ts[1], reference(dist.ReduceOp.SUM, contributions(torch.float32, 3)), "3 elements")
    outs = [[torch.zeros(4), torch.zeros(2)] for _ in M]
    dist.all_gather_coalesced(outs, [value_of(RANK), torch.tensor([RANK, -RANK], dtype=torch.float32)], group=G)
    for g, (a, b) in zip(M, outs):
        expect_equal(a, value_of(g), f"input 0 of {g}")
        expect_equal(b, torch.tensor([g, -g], dtype=torch.float32), f"input 1 of {g}")


def async_collectives():
    a = sample(torch.float32, RANK)
    b = value_of(RANK) if RANK == M[0] else torch.zeros(4)
    out = [torch.zeros(4) for _ in M]
    works = [dist.all_reduce(a, group=G, async_op=True),
             dist.broadcast(b, src=M[0], group=G, async_op=True),
             dist.all_gather(out, value_of(RANK), group=G, async_op=True),
             dist.barrier(group=G, async_op=True)]
    for w in works:
        w.wait()
        expect(w.is_completed(), "completed after wait")
    expect_equal(a, reference(dist.ReduceOp.SUM, contributions(torch.float32)), "all_reduce")
    expect_equal(b, value_of(M[0]), "broadcast")
    for g, o in zip(M, out):
        expect_equal(o, value_of(g), f"all_gather from {g}")
    fut = dist.all_reduce(c := torch.ones(2), group=G, async_op=True).get_future()
    expect_equal(fut.wait()[0], torch.full((2,), float(len(M))), "get_future")
    expect_equal(c, torch.full((2,), float(len(M))), "get_future's tensor")


def barriers():
    for _ in range(3):
        dist.barrier(group=G)
    dist.monitored_barrier(group=G)
    dist.monitored_barrier(group=G, wait_all_ranks=True)


def object_collectives():
    objs = [None] * len(M)
    dist.all_gather_object(objs, {"rank": RANK}, group=G)
    expect(objs == [{"rank": g} for g in M], f"all_gather_object gave {objs}")
    lst = [f"from {RANK}", RANK] if RANK == M[0] else [None, None]
    dist.broadcast_object_list(lst, src=M[0], group=G)
    expect(lst == [f"from {M[0]}", M[0]], f"broadcast_object_list gave {lst}")


CHECKS = [send_recv_ring, any_source_gives_global_ranks, every_dtype_point_to_point,
          conversion_on_receive, non_contiguous_point_to_point, async_point_to_point,
          size_mismatch_raises_and_keeps_the_message, tags_separate_messages,
          all_reduce_every_dtype_and_op, all_reduce_avg_and_complex, all_reduce_non_contiguous,
          broadcast_from_every_root, reduce_leaves_other_inputs, all_gather_lists_and_tensor,
          all_gather_non_contiguous_outputs, gather_and_scatter, reduce_scatter_list_and_tensor,
          all_to_all_lists_and_single, coalesced_forms, async_collectives, barriers,
          object_collectives]

# The world, a sub-group that leaves rank 0 out (its group ranks differ from global ranks),
# and one of every rank in another order of creation.
groups = [("world", None)]
sub_a = dist.new_group(ranks=list(range(1, WORLD)))
sub_b = dist.new_group(ranks=[0, WORLD - 1])
groups += [("ranks 1..n-1", sub_a), ("ranks 0,n-1", sub_b)]
for label, group in groups:
    if group is not None and group == dist.GroupMember.NON_GROUP_MEMBER:
        continue
    G, M = group, members(group)
    if len(M) < 2:
        continue
    ME = M.index(RANK)
    run_checks(CHECKS, label)
dist.barrier()
say(f"DONE rank={RANK}")
finish()
