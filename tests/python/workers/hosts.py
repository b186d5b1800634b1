"""A rank of a job across emulated hosts (tests/python/test_hosts.py): every operation that
works across hosts, checked on every rank. Prints "PASS/FAIL <check> rank=<r>" lines and
"DIGEST <rank> <hex>" of the all_reduce result (compared across ranks by the test).

    hosts.py [ops|init|one_host|peer_dies <waiters> [recv|all_reduce]|recv_times_out]
        ops: the checks; init: only init_process_group and destroy; one_host: the world is the
        plain "shm" group; peer_dies <waiters> [recv|all_reduce]: global rank 3 (host B's second
        rank) is SIGKILLed after a barrier while the ranks in <waiters> (comma-separated) wait
        in a recv from it (or an all_reduce); each
        prints "CAUGHT rank=<r> <exception type>: <first line>" (the others leave at once);
        recv_times_out: rank 2 receives from rank 3, which sends nothing and stays past the
        timeout, and prints what it caught as above
"""

import hashlib
import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import shmdist.torch
from common import expect, expect_equal, expect_raises, run_checks, say

mode = sys.argv[1] if len(sys.argv) > 1 else "ops"
# The test bounds its own run time well below a timeout it sets here (SHMDIST_TEST_INIT_TIMEOUT)
# when it expects a failure within seconds: waiting out this timeout would fail it.
# SHMDIST_TEST_INIT_METHOD (file://...): that init method instead of env://, which has torch
# wait for every rank before the backend is created.
init_timeout = timedelta(seconds=float(os.environ.get("SHMDIST_TEST_INIT_TIMEOUT", "60")))
if os.environ.get("SHMDIST_TEST_INIT_METHOD"):
    dist.init_process_group("shm", init_method=os.environ["SHMDIST_TEST_INIT_METHOD"],
                            rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]), timeout=init_timeout)
else:
    dist.init_process_group("shm", timeout=init_timeout)
rank, world = dist.get_rank(), dist.get_world_size()
from torch.distributed import distributed_c10d as c10d  # noqa: E402


def caught_then_after(what, call, times=1, then=None):
    """The modes whose call every rank must raise: prints "CAUGHT rank=<r> <exception type>:
    <first line>" (or "FAIL <what> ..." if call() returned) for each of `times` calls, then a
    correct all_reduce's "AFTER rank=<r> ok" (the failed calls moved nothing), then runs
    `then` (more checked calls), and leaves."""
    for _ in range(times):
        try:
            call()
            say(f"FAIL {what} rank={rank}: the call returned")
        except Exception as e:  # noqa: BLE001 - the test reads what was raised
            say(f"CAUGHT rank={rank} {type(e).__name__}: {str(e).splitlines()[0]}")
    t = torch.full((3,), float(rank))
    dist.all_reduce(t)
    say(f"AFTER rank={rank} {'ok' if t.tolist() == [6.0] * 3 else t.tolist()}")
    if then is not None:
        then()
    dist.destroy_process_group()
    sys.exit(0)


if mode == "init":
    say(f"INIT rank={rank}")
    dist.destroy_process_group()
    sys.exit(0)
if mode == "one_host":
    t = torch.full((2,), float(rank))
    dist.all_reduce(t)
    pg = c10d._get_default_group()
    if (not isinstance(pg, shmdist.torch.ProcessGroupHosts)
            and torch.equal(t, torch.full((2,), 6.0))):
        say(f"ONE HOST rank={rank}")
    else:
        say(f"FAIL one_host rank={rank}: {pg!r} {t}")
    dist.destroy_process_group()
    sys.exit(0)

if mode == "three_leaders":
    # Issue 30 (tiny30): hosts [0], [1, 2], [3]: three leaders (0, 1, 3), each connected to
    # the other two for the agreement's frames. 4 B all_reduces (the documented order: hosts
    # in order, ((x0) + (x1 + x2)) + (x3)), a mismatch between hosts (every rank raises), then
    # a broadcast from host [1, 2] and an all_reduce above the frame's payload.
    pg = c10d._get_default_group()
    expect(isinstance(pg, shmdist.torch.ProcessGroupHosts) and len(pg.hosts) == 3, repr(pg))
    x = [0.1, 0.2, 0.3, 1e8]
    f = [torch.tensor([v], dtype=torch.float32) for v in x]
    want = (f[0] + (f[1] + f[2])) + f[3]
    for i in range(20):
        one = torch.tensor([x[rank]], dtype=torch.float32)
        dist.all_reduce(one)
        if one.numpy().tobytes() != want.numpy().tobytes():
            say(f"FAIL three_leaders rank={rank}: call {i}: {one.tolist()} != {want.tolist()}")
    try:
        dist.all_reduce(torch.zeros(5 if rank == 3 else 4))
        say(f"FAIL three_leaders rank={rank}: the mismatched all_reduce returned")
    except Exception as e:  # noqa: BLE001 - the test reads what was raised
        say(f"CAUGHT rank={rank} {type(e).__name__}: {str(e).splitlines()[0]}")
    b = torch.full((3,), float(rank))
    dist.broadcast(b, 2)
    big = torch.full((3000,), float(rank))
    dist.all_reduce(big)
    if b.tolist() == [2.0] * 3 and bool((big == 6.0).all()):
        say(f"AFTER rank={rank} ok")
    dist.destroy_process_group()
    sys.exit(0)

if mode == "peer_dies":
    waiters = [int(r) for r in sys.argv[2].split(",")]
    call = sys.argv[3] if len(sys.argv) > 3 else "recv"
    dist.barrier()
    if rank == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    if rank in waiters:
        try:
            if call == "recv":
                dist.recv(torch.zeros(1), 3)
            elif call == "all_reduce_async":  # the error reaches wait() unchanged
                dist.all_reduce(torch.ones(1), async_op=True).wait()
            else:
                dist.all_reduce(torch.ones(1))
            say(f"FAIL peer_dies rank={rank}: {call} with the killed rank 3 returned")
        except Exception as e:  # noqa: BLE001 - the test reads what was raised
            say(f"CAUGHT rank={rank} {type(e).__name__}: {str(e).splitlines()[0]}")
    # Without teardown: the job lost a rank, and the test only reads what was raised. After
    # a pause, as a program logging its error would: env:// keeps the store in rank 0's
    # process, and ranks that learn the cause from it after rank 0 left cannot (docs/hosts.md).
    time.sleep(2)
    os._exit(0)

if mode == "async_order":
    # torch 2: collectives posted with async_op=True run in the order posted while this
    # thread goes on. Rank 0 posts an all_reduce and a broadcast, then sends to rank 2, which
    # receives before it posts them: a program that runs on gloo, and hung while every
    # collective across hosts completed before it returned. Waited for in reverse order.
    def async_order():
        a = torch.full((2,), float(rank + 1))
        b = torch.full((3,), float(rank))
        if rank == 2:
            got = torch.zeros(1)
            dist.recv(got, 0)
            expect_equal(got, torch.full((1,), 7.0), "the message rank 0 sent after posting")
        works = [dist.all_reduce(a, async_op=True), dist.broadcast(b, 3, async_op=True)]
        if rank == 0:
            dist.send(torch.full((1,), 7.0), 2)
        # An operation over gloo among all ranks while the posted ones may still be pending:
        # its check across hosts meets the others over the same "shm" part and leaders' group,
        # so it must come after them on every rank.
        pieces = [torch.zeros(1) for _ in range(world)]
        dist.all_gather(pieces, torch.full((1,), float(rank)))
        expect_equal(torch.cat(pieces), torch.arange(float(world)), "all_gather after them")
        future = works[0].get_future()
        works[1].wait()
        works[0].wait()
        expect(works[0].is_completed() and works[1].is_completed(), "completed after wait")
        expect_equal(a, torch.full((2,), 10.0), "all_reduce posted first")
        expect_equal(b, torch.full((3,), 3.0), "broadcast from rank 3 posted second")
        expect_equal(future.wait()[0], torch.full((2,), 10.0), "the all_reduce's future")
        c = torch.full((1,), float(rank))
        dist.all_reduce(c)  # a call that waits at once, after the posted ones
        expect_equal(c, torch.full((1,), 6.0), "all_reduce after them")
    run_checks([async_order])
    dist.barrier()
    dist.destroy_process_group()
    say(f"DONE rank={rank}")
    sys.exit(0)

if mode == "recv_times_out":
    # Rank 2 waits over host B's "shm" job for a message rank 3 never sends; the others stay
    # past the timeout (rank 0 holds env://'s store).
    dist.barrier()
    if rank == 2:
        try:
            dist.recv(torch.zeros(1), 3)
            say(f"FAIL recv_times_out rank={rank}: recv returned")
        except Exception as e:  # noqa: BLE001 - the test reads what was raised
            say(f"CAUGHT rank={rank} {type(e).__name__}: {str(e).splitlines()[0]}")
    else:
        time.sleep(float(os.environ["SHMDIST_TEST_INIT_TIMEOUT"]) + 5)
    os._exit(0)

if mode == "timeout_then_peer_exits":
    # Rank 0 waits over gloo for a message global rank 2 (the other host) never sends; rank 2
    # exits without finalizing (os._exit) 2 s after rank 0's wait timed out, inside the 3 s a
    # failed call waits for a death's record: the cause is the timeout, not a death (2 s, not
    # 1: rank 0 may begin its wait late, when the machine is busy, by up to that). The
    # others stay past it (rank 0 holds env://'s store). Rank 0 prints what it caught.
    dist.barrier()
    limit = float(os.environ["SHMDIST_TEST_INIT_TIMEOUT"])
    if rank == 0:
        try:
            dist.recv(torch.zeros(1), 2)
            say(f"FAIL timeout_then_peer_exits rank={rank}: recv returned")
        except Exception as e:  # noqa: BLE001 - the test reads what was raised
            say(f"CAUGHT rank={rank} {type(e).__name__}: {str(e).splitlines()[0]}")
        time.sleep(3)
    elif rank == 2:
        time.sleep(limit + 2)
        os._exit(0)
    else:
        time.sleep(limit + 8)
    os._exit(0)

if mode == "monitored":
    # The ranks in argv[2] (comma-separated) skip a monitored_barrier the others enter;
    # argv[3] "all" asks for wait_all_ranks. Every rank that entered prints what it caught.
    skip = [int(r) for r in sys.argv[2].split(",")]
    wait_all = len(sys.argv) > 3 and sys.argv[3] == "all"
    dist.barrier()
    if rank not in skip:
        try:
            dist.monitored_barrier(timeout=timedelta(seconds=3), wait_all_ranks=wait_all)
            say(f"FAIL monitored rank={rank}: monitored_barrier without ranks {skip} returned")
        except Exception as e:  # noqa: BLE001 - the test reads what was raised
            say(f"CAUGHT rank={rank} {type(e).__name__}: {str(e).splitlines()[0]}")
    else:
        time.sleep(8)  # past the others' timeout: skipped, not gone
    os._exit(0)

if mode == "mismatch":
    # Host B's ranks disagree on a broadcast's source (rank 3 names itself, the others rank
    # 2): host B's "shm" part finds it; ranks 2 and 3 print what they caught.
    dist.barrier()
    if rank in (2, 3):
        try:
            dist.broadcast(torch.zeros(4), rank)
            say(f"FAIL mismatch rank={rank}: the broadcast returned")
        except Exception as e:  # noqa: BLE001 - the test reads what was raised
            say(f"CAUGHT rank={rank} {type(e).__name__}: {str(e).splitlines()[0]}")
    time.sleep(2)
    os._exit(0)

if mode == "cross_mismatch":
    # Issue 30: host A (ranks 0, 1) and host B (ranks 2, 3) call collectives that disagree
    # (argv[2] says how; each host agrees within itself). Every rank prints what it caught,
    # then all call a correct all_reduce: the failed call moved nothing, the group still works.
    case = sys.argv[2]
    host_a = rank < 2
    small, large = 4, 300_000  # large: above the composite's small-frame limit (4 KiB)
    piped = shmdist.torch.ProcessGroupHosts.PIPELINE // 4  # float32 elements, pipelined path

    def call():
        if case == "all_reduce_vs_broadcast":
            t = torch.zeros(small)
            return dist.all_reduce(t) if host_a else dist.broadcast(t, 2)
        if case in ("count_small", "count_large", "count_small_vs_large", "count_pipelined"):
            a, b = {"count_small": (small, 8), "count_large": (large, large + 1),
                    "count_small_vs_large": (small, large), "count_pipelined": (piped, piped + 1)
                    }[case]
            return dist.all_reduce(torch.zeros(a if host_a else b))
        if case == "dtype":
            return dist.all_reduce(torch.zeros(small, dtype=torch.float32 if host_a
                                               else torch.float64))
        if case == "op":
            return dist.all_reduce(torch.zeros(small), op=dist.ReduceOp.SUM if host_a
                                   else dist.ReduceOp.MAX)
        if case == "root":
            return dist.broadcast(torch.zeros(small), 0 if host_a else 2)
        if case == "all_gather":
            n = small if host_a else 8
            return dist.all_gather([torch.zeros(n) for _ in range(world)], torch.zeros(n))
        if case == "all_to_all_splits":
            # Rank 0 sends 1 element to rank 2, which expects 2 from it.
            return dist.all_to_all_single(torch.zeros(4), torch.zeros(4), [1, 1, 1, 1] if host_a
                                          else [2, 1, 1, 0], [1, 1, 1, 1])
        if case in ("inside_host_b", "inside_host_b_large", "inside_host_b_pipelined",
                    "inside_host_b_twice"):
            # Host B's ranks disagree among themselves (rank 3 one more element), host A agrees.
            # "twice": two such calls in a row, so host B's leader leaves two calls without
            # reading host A's frames of them (link._FrameLink drops them at its next call).
            n = {"inside_host_b": small, "inside_host_b_large": large,
                 "inside_host_b_pipelined": piped, "inside_host_b_twice": small}[case]
            return dist.all_reduce(torch.zeros(n + 1 if rank == 3 else n))
        if case == "inside_host_b_all_gather":
            # Review 6: host B's leader (rank 2) calls all_gather, the others all_reduce: the
            # leader's check of an operation over gloo among all ranks finds it inside host B
            # and must tell host A's leader, waiting in the leaders' exchange.
            if rank == 2:
                return dist.all_gather([torch.zeros(small) for _ in range(world)],
                                       torch.zeros(small))
            return dist.all_reduce(torch.zeros(small))
        if case == "inside_host_b_reduce":
            # Host B's rank 3 calls reduce (dst 0), the others all_reduce of the same count.
            t = torch.zeros(small)
            return dist.reduce(t, 0) if rank == 3 else dist.all_reduce(t)
        if case == "inside_host_a_reduce_scatter":
            # Host A's rank 1 calls reduce_scatter_tensor of 8 elements in all, the others
            # all_reduce of 8.
            if rank == 1:
                return dist.reduce_scatter_tensor(torch.zeros(2), torch.zeros(8))
            return dist.all_reduce(torch.zeros(8))
        if case in ("broadcast_src_inside_host_b", "broadcast_src_inside_host_a"):
            # Small broadcast: one rank of a host names another source, on its own host
            # (rank 3: src 2) or on another (rank 1: src 2), the others src 0.
            odd = 3 if case.endswith("host_b") else 1
            return dist.broadcast(torch.zeros(small), 2 if rank == odd else 0)
        raise SystemExit(f"unknown case {case}")
    dist.barrier()
    def after_twice():
        # The frames after the dropped ones: a 4 B all_reduce in the documented order (hosts
        # [0, 1], [2, 3]: (x0 + x1) + (x2 + x3), bitwise), a small broadcast from host B, a
        # barrier and an all_reduce above the frame's payload (its check only in the frame).
        x = [0.1, 0.2, 0.3, 1e8]
        one = torch.tensor([x[rank]], dtype=torch.float32)
        dist.all_reduce(one)
        f = [torch.tensor([v], dtype=torch.float32) for v in x]
        want = (f[0] + f[1]) + (f[2] + f[3])
        b = torch.full((2,), float(rank))
        dist.broadcast(b, 3)
        dist.barrier()
        big = torch.full((2000,), float(rank))
        dist.all_reduce(big)
        say(f"AFTER2 rank={rank} " + ("ok" if one.numpy().tobytes() == want.numpy().tobytes()
                                       and b.tolist() == [3.0, 3.0]
                                       and bool((big == 6.0).all()) else
                                       f"{one.tolist()} {want.tolist()} {b.tolist()} "
                                       f"{big[:3].tolist()}"))

    if case.endswith("_twice"):
        caught_then_after("cross_mismatch", call, times=2, then=after_twice)
    caught_then_after("cross_mismatch", call)

if mode == "any_source_then_other_size":
    # Review 5: rank 0 receives with src=None a message of 4 elements from argv[2]'s first
    # rank, then a named receive of 8 elements from its second (the other transport's
    # speculative receive, posted for the any-source one, is still pending). On one host
    # (gloo or "shm") the named receive gets the 8 elements. Rank 0 prints what it caught.
    first, second = (int(r) for r in sys.argv[2].split(","))
    dist.barrier()
    if rank == 0:
        try:
            t = torch.zeros(4)
            src = dist.recv(t)
            dist.send(torch.zeros(1), second, tag=1)  # the second sender's go
            u = torch.zeros(8)
            dist.recv(u, second)
            if src == first and torch.equal(t, torch.full((4,), 1.0)) and \
                    torch.equal(u, torch.full((8,), 2.0)):
                say(f"RECEIVED rank={rank}")
            else:
                say(f"FAIL any_source_then_other_size rank={rank}: got {src} {t} {u}")
        except Exception as e:  # noqa: BLE001 - the test reads what was raised
            say(f"CAUGHT rank={rank} {type(e).__name__}: {str(e).splitlines()[0]}")
    elif rank == first:
        dist.send(torch.full((4,), 1.0), 0)
    elif rank == second:
        dist.recv(torch.zeros(1), 0, tag=1)
        dist.send(torch.full((8,), 2.0), 0)
    time.sleep(3)
    os._exit(0)

if mode == "size_mismatch_across_hosts":
    # Rank 2 sends 8 float32, 3 int64, 64 float32 to rank 0, which receives 4 float32 from it
    # (after a recv(src=None) that rank 1 serves, with argv[2] "any"), then 8 float32, 3
    # float32, 3 int64, 32 float32, 64 float32. Rank 0 prints what it caught and whether the
    # kept messages came. With "any", rank 2 sends only once rank 0's recv(src=None) took rank
    # 1's message (a token on tag 9): else rank 2's 8 elements may reach that receive first,
    # which is a size mismatch raised where the test does not expect one (seen under load).
    any_source = len(sys.argv) > 2 and sys.argv[2] == "any"
    dist.barrier()
    if rank == 0:
        if any_source:
            dist.recv(torch.zeros(4))
            dist.send(torch.zeros(1), 2, tag=9)
        for t in (torch.zeros(4), torch.zeros(8), torch.zeros(3),
                  torch.zeros(3, dtype=torch.int64), torch.zeros(32), torch.zeros(64)):
            try:
                dist.recv(t, 2)
            except Exception as e:  # noqa: BLE001 - the test reads what was raised
                say(f"CAUGHT rank={rank} {type(e).__name__}: {str(e).splitlines()[0]}")
            if t.numel() == 8 and not torch.equal(t, torch.full((8,), 2.0)):
                say(f"FAIL size_mismatch_across_hosts rank={rank}: got {t}")
            if t.dtype == torch.int64 and not torch.equal(t, torch.full((3,), 7)):
                say(f"FAIL size_mismatch_across_hosts rank={rank}: got {t}")
            if t.numel() == 64 and torch.equal(t, torch.arange(64.0)):
                say(f"RECEIVED rank={rank}")
    elif rank == 1 and any_source:
        dist.send(torch.full((4,), 1.0), 0)
    elif rank == 2:
        if any_source:
            dist.recv(torch.zeros(1), 0, tag=9)
        dist.send(torch.full((8,), 2.0), 0)
        dist.send(torch.full((3,), 7, dtype=torch.int64), 0)
        dist.send(torch.arange(64.0), 0)  # larger than a header holds: a payload of its own
    time.sleep(3)
    os._exit(0)

if mode == "stale_any_source_times_out":
    # Review 5: rank 0's recv(src=None) is served by rank 1 (its host); the receive the
    # mailbox posted over gloo for it stays pending past the group's timeout; then a named
    # receive from rank 1 (sent after the timeout) must still get its message.
    dist.barrier()
    limit = float(os.environ["SHMDIST_TEST_INIT_TIMEOUT"])
    if rank == 0:
        t = torch.zeros(4)
        dist.recv(t)
        time.sleep(limit + 3)
        try:
            u = torch.zeros(4)
            dist.recv(u, 1)
            v = torch.zeros(4)
            src = dist.recv(v)  # the leftover gloo receive, waited past its timeout, takes it
            if torch.equal(u, torch.full((4,), 2.0)) and src == 2 and \
                    torch.equal(v, torch.full((4,), 3.0)):
                say(f"RECEIVED rank={rank}")
            else:
                say(f"FAIL stale_any_source_times_out rank={rank}: got {u} {src} {v}")
        except Exception as e:  # noqa: BLE001 - the test reads what was raised
            say(f"CAUGHT rank={rank} {type(e).__name__}: {str(e).splitlines()[0]}")
    elif rank == 1:
        dist.send(torch.full((4,), 1.0), 0)
        time.sleep(limit + 3)
        dist.send(torch.full((4,), 2.0), 0)
    elif rank == 2:
        time.sleep(limit + 4)
        dist.send(torch.full((4,), 3.0), 0)
    else:
        time.sleep(limit + 3)
    time.sleep(3)
    os._exit(0)

if mode == "coalescing_abandoned":
    # Review 5 (torch 2): a _coalescing_manager whose body raised (user code) never calls
    # _end_coalescing (torch has no finally there); the next manager must still work, as
    # with NCCL. Each rank exchanges with its partner on the other host; prints the outcome.
    peer = {0: 2, 2: 0, 1: 3, 3: 1}[rank]
    dist.barrier()
    try:
        with dist._coalescing_manager(device=torch.device("cpu"), async_ops=True):
            raise ValueError("user code failed inside the manager")
    except ValueError:
        pass
    try:
        t = torch.zeros(2)
        with dist._coalescing_manager(device=torch.device("cpu"), async_ops=True) as cm:
            dist.isend(torch.full((2,), float(rank)), peer)
            dist.irecv(t, peer)
        cm.wait()
        if torch.equal(t, torch.full((2,), float(peer))):
            say(f"COALESCED rank={rank}")
        else:
            say(f"FAIL coalescing_abandoned rank={rank}: got {t}")
    except Exception as e:  # noqa: BLE001 - the test reads what was raised
        say(f"CAUGHT rank={rank} {type(e).__name__}: {str(e).splitlines()[0]}")
    time.sleep(3)
    os._exit(0)

if mode == "any_source_behind_named":
    # Review 5: rank 0 posts irecv(src=None), irecv(src=2), irecv(src=None) (tag 7). Rank 2's
    # first message serves the first; rank 3 (rank 2's host) then sends one, which the third
    # (any source) must get, as with MPI or gloo; only after that does rank 2 send its
    # second, for the named receive. Rank 0 prints what it got or caught.
    dist.barrier()
    if rank == 0:
        got = [torch.zeros(2) for _ in range(3)]
        works = [dist.irecv(got[0], tag=7), dist.irecv(got[1], 2, tag=7),
                 dist.irecv(got[2], tag=7)]
        try:
            works[0].wait()
            dist.send(torch.zeros(1), 3, tag=8)  # rank 3's go
            works[2].wait()
            dist.send(torch.zeros(1), 2, tag=8)  # rank 2's go for its second
            works[1].wait()
            values_got = [t[0].item() for t in got]
            if values_got == [1.0, 2.0, 3.0]:
                say(f"RECEIVED rank={rank}")
            else:
                say(f"FAIL any_source_behind_named rank={rank}: got {values_got}")
        except Exception as e:  # noqa: BLE001 - the test reads what was raised
            say(f"CAUGHT rank={rank} {type(e).__name__}: {str(e).splitlines()[0]}")
    elif rank == 2:
        dist.send(torch.full((2,), 1.0), 0, tag=7)
        dist.recv(torch.zeros(1), 0, tag=8)
        dist.send(torch.full((2,), 2.0), 0, tag=7)
    elif rank == 3:
        dist.recv(torch.zeros(1), 0, tag=8)
        dist.send(torch.full((2,), 3.0), 0, tag=7)
    time.sleep(3)
    os._exit(0)

if mode == "own_rejection":
    # Issue 30: global rank argv[3] refuses its own arguments of the collective argv[2] (an
    # output of the wrong size), the others call it correctly: every rank prints what it
    # caught, then all call a correct all_reduce (the refused call moved nothing).
    case, bad = sys.argv[2], int(sys.argv[3])
    n = 4 if case.endswith("small") else 300_000
    extra = 1 if rank == bad else 0

    def call():
        if case.startswith("all_gather_into_tensor"):
            dist.all_gather_into_tensor(torch.zeros(n * world + extra), torch.zeros(n))
        elif case.startswith("reduce_scatter_tensor"):
            dist.reduce_scatter_tensor(torch.zeros(n), torch.zeros(n * world + extra))
        else:
            raise SystemExit(f"unknown case {case}")
    dist.barrier()
    caught_then_after("own_rejection", call)

if mode == "exit_pending":
    # Item 30 (teardown): rank 0 posts an all_reduce (asyncOp) and an isend of a payload to
    # rank 2 (a header, then the payload from the group's send thread), waits for neither
    # and leaves without destroy_process_group; the others call theirs 3 s later, so rank
    # 0's threads are still in their gloo and "shm" waits when its interpreter exits. Every
    # rank prints what it got; all must exit 0 with the right numbers.
    dist.barrier()
    t = torch.full((1000,), float(rank))
    if rank == 0:
        # The Works are kept (not waited for): gloo drops a send whose Work is gone.
        pending = [dist.all_reduce(t, async_op=True), dist.isend(torch.arange(64.0), 2)]
        say(f"LEFT rank={rank}")
        sys.exit(0)
    time.sleep(3)
    dist.all_reduce(t)
    ok = torch.equal(t, torch.full((1000,), 6.0))
    if rank == 2:
        u = torch.zeros(64)
        dist.recv(u, 0)
        ok = ok and torch.equal(u, torch.arange(64.0))
    say(f"EXITED rank={rank} {'ok' if ok else 'wrong'}")
    sys.exit(0)

if mode == "exit_chained":
    # Review of issue 30 (teardown): rank 0 posts an all_reduce whose future's callback posts
    # a second one (as DDP's PowerSGD hook does), half a second after the first completed
    # (the group's thread, stopping with nothing queued, has ended by then), and leaves
    # without waiting for either; the others call the first 3 s later, the second 2 s after
    # it, so rank 0's exit is still in its second when the interpreter would finalize. Every
    # rank prints what it got; all must exit 0 with the right numbers.
    dist.barrier()
    t = torch.full((1000,), float(rank))
    u = torch.full((10,), float(rank))
    if rank == 0:
        def chain(fut):
            time.sleep(0.5)
            return dist.all_reduce(u, async_op=True)
        work = dist.all_reduce(t, async_op=True)
        pending = [work, work.get_future().then(chain)]
        say(f"LEFT rank={rank}")
        sys.exit(0)
    time.sleep(3)
    dist.all_reduce(t)
    time.sleep(2)
    dist.all_reduce(u)
    ok = torch.equal(t, torch.full((1000,), 6.0)) and torch.equal(u, torch.full((10,), 6.0))
    say(f"EXITED rank={rank} {'ok' if ok else 'wrong'}")
    sys.exit(0)

HOSTS = [[0, 1], [2, 3]]  # the test runs 2 hosts x 2 ranks


def values(r, n=1000):
    """Rank r's input: large and small values, so that the order of the sum shows in its bits."""
    g = torch.Generator().manual_seed(1000 + r)
    return torch.randn(n, generator=g, dtype=torch.float32) * (10.0 ** (r % 3 * 4))


def documented_sum(ranks_by_host):
    """The order docs/hosts.md promises: in rank order inside each host, then host partials
    in host order."""
    acc = None
    for host in ranks_by_host:
        part = values(host[0])
        for r in host[1:]:
            part = part + values(r)
        acc = part if acc is None else acc + part
    return acc


def sum_in_documented_order(inputs):
    """documented_sum's order over the given inputs, rank r's being inputs[r]."""
    acc = None
    for host in HOSTS:
        part = inputs[host[0]]
        for r in host[1:]:
            part = part + inputs[r]
        acc = part if acc is None else acc + part
    return acc


def group_is_hosts():
    pg = c10d._get_default_group()
    expect(isinstance(pg, shmdist.torch.ProcessGroupHosts), f"the world is {pg!r}")
    expect(pg.hosts == HOSTS, f"hosts {pg.hosts}")
    # The emulated hosts share this machine: each host's job counts its share of the CPUs
    # (the group's ranks on the machine go to its creation), not all of them.
    cpus = len(os.sched_getaffinity(0))
    cpus = cpus if cpus > 1 else os.cpu_count()
    host = len(next(h for h in HOSTS if rank in h))
    share = max(1, cpus * host // sum(len(h) for h in HOSTS))
    want = int(os.environ.get("SHMDIST_LOCAL_CPUS") or (share if share < cpus else cpus))
    got = shmdist._C._job_cpus(pg.local)
    expect(got == want, f"the host's job counts {got} CPUs, expected {want}")


def all_reduce_documented_order():
    t = values(rank)
    dist.all_reduce(t)
    expect_equal(t, documented_sum(HOSTS), "all_reduce SUM")
    say(f"DIGEST {rank} {hashlib.sha256(t.numpy().tobytes()).hexdigest()}")
    for op, combine in ((dist.ReduceOp.MAX, torch.maximum), (dist.ReduceOp.MIN, torch.minimum)):
        t = values(rank)
        dist.all_reduce(t, op=op)
        expected = values(0)
        for r in range(1, world):
            expected = combine(expected, values(r))
        expect_equal(t, expected, f"all_reduce {op}")
    t = torch.full((3,), rank + 2, dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.PRODUCT)
    expect_equal(t, torch.full((3,), 2 * 3 * 4 * 5, dtype=torch.int64), "all_reduce PRODUCT")
    work = dist.all_reduce(torch.ones(4), async_op=True)
    work.wait()
    # Larger than a ring and than gloo's small messages: the leaders' gloo all_reduce (SUM)
    # and all-gather (MAX) combine the host partials in the same order.
    n = 80_000  # 320 KB
    t = values(rank, n)
    dist.all_reduce(t)
    expect_equal(t, sum_in_documented_order([values(r, n) for r in range(world)]),
                 "all_reduce SUM of 320 KB")
    t = values(rank, n)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    expect_equal(t, torch.maximum(torch.maximum(values(0, n), values(1, n)),
                                  torch.maximum(values(2, n), values(3, n))),
                 "all_reduce MAX of 320 KB")
    # At least ProcessGroupHosts.PIPELINE bytes: the leaders' schedule in pieces of PIECE
    # bytes, each piece's step between hosts posted while the next is reduced inside the host;
    # the same order, so the same bits. A count that leaves a last piece of 12 bytes; SUM
    # (the leaders' gloo all_reduce per piece), MAX (an all-gather per piece), AVG of a
    # non-contiguous view (through a contiguous copy, written back).
    hosts_cls = shmdist.torch.ProcessGroupHosts
    n = hosts_cls.PIPELINE // 4 + 3
    expect(n * 4 > 2 * hosts_cls.PIECE, "the pipelined call has at least three pieces")
    inputs = [values(r, n) for r in range(world)]
    t = inputs[rank].clone()
    dist.all_reduce(t)
    expect_equal(t, sum_in_documented_order(inputs), "all_reduce SUM of PIPELINE bytes + 12")
    say(f"PIPEDIGEST {rank} {hashlib.sha256(t.numpy().tobytes()).hexdigest()}")
    t = inputs[rank].clone()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    expect_equal(t, torch.maximum(torch.maximum(inputs[0], inputs[1]),
                                  torch.maximum(inputs[2], inputs[3])),
                 "all_reduce MAX of PIPELINE bytes + 12")
    both = torch.stack([inputs[rank], torch.zeros(n)], 1)
    t = both[:, 0]
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    expect_equal(t, sum_in_documented_order(inputs) / world, "all_reduce AVG of a strided view")
    expect_equal(both[:, 1], torch.zeros(n), "the view's neighbours untouched")
    del inputs, both
    # NaNs with a payload of each rank's own: which NaN a sum keeps depends on the order of
    # its operands, so every rank holding the same bits (NANDIGEST, compared by the test)
    # shows that both leaders combined the two host partials in the same order.
    t = torch.tensor([0x7FC00000 | (rank + 1)] * 3, dtype=torch.int32).view(torch.float32)
    dist.all_reduce(t)
    say(f"NANDIGEST {rank} {t.view(torch.int32).tolist()}")


def reduce_to_each():
    for dst in range(world):
        t = values(rank)
        dist.reduce(t, dst)
        if rank == dst:
            expect_equal(t, documented_sum(HOSTS), f"reduce to {dst}")


def broadcast_from_each():
    for src in range(world):
        t = torch.full((5,), float(rank)) if rank != src else torch.arange(5.0) + src
        dist.broadcast(t, src)
        expect_equal(t, torch.arange(5.0) + src, f"broadcast from {src}")


def p2p_ring():
    # 0->1 and 2->3 stay on a host, 1->2 and 3->0 cross hosts.
    out = torch.arange(6.0) + 10 * rank
    got = torch.zeros(6)
    to, frm = (rank + 1) % world, (rank - 1) % world
    if rank % 2 == 0:
        dist.send(out, to, tag=7)
        dist.recv(got, frm, tag=7)
    else:
        dist.recv(got, frm, tag=7)
        dist.send(out, to, tag=7)
    expect_equal(got, torch.arange(6.0) + 10 * frm, f"recv from {frm}")
    reqs = [dist.isend(out + 1, (rank + 2) % world), dist.irecv(got, (rank + 2) % world)]
    for req in reqs:
        req.wait()
    expect_equal(got, torch.arange(6.0) + 10 * ((rank + 2) % world) + 1, "irecv across hosts")


def all_gather_and_barrier():
    outs = [torch.zeros(3) for _ in range(world)]
    dist.all_gather(outs, torch.full((3,), float(rank)))
    for r in range(world):
        expect_equal(outs[r], torch.full((3,), float(r)), f"all_gather from {r}")
    dist.barrier()
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank})
    expect(objs == [{"rank": r} for r in range(world)], f"all_gather_object {objs}")
    flat = torch.zeros(world * 2)
    dist._all_gather_base(flat, torch.full((2,), float(rank)))  # all_gather_into_tensor on 2.x
    expect_equal(flat, torch.arange(float(world)).repeat_interleave(2), "all_gather_into_tensor")
    for root in (0, 3):
        got = [torch.zeros(2) for _ in range(world)] if rank == root else None
        dist.gather(torch.full((2,), float(rank)), got, dst=root)
        if rank == root:
            for r in range(world):
                expect_equal(got[r], torch.full((2,), float(r)), f"gather to {root}")
        out = torch.zeros(2)
        dist.scatter(out, [torch.full((2,), 10.0 + r) for r in range(world)] if rank == root
                     else None, src=root)
        expect_equal(out, torch.full((2,), 10.0 + rank), f"scatter from {root}")
    objs = [{"from": 2}] if rank == 2 else [None]
    dist.broadcast_object_list(objs, src=2)
    expect(objs == [{"from": 2}], f"broadcast_object_list {objs}")


def sub_groups():
    across = dist.new_group([1, 2, 3])
    inside = dist.new_group([2, 3])
    if rank in (1, 2, 3):
        t = values(rank)
        dist.all_reduce(t, group=across)
        expect_equal(t, values(1) + (values(2) + values(3)), "all_reduce on [1, 2, 3]")
    if rank in (2, 3):
        t = values(rank)
        dist.all_reduce(t, group=inside)
        expect_equal(t, values(2) + values(3), "all_reduce on [2, 3]")
        expect(not isinstance(inside, shmdist.torch.ProcessGroupHosts), f"{inside!r}")


def piece(r, j, n=300):
    """Rank r's input for rank j in reduce_scatter: values whose sum shows its order."""
    return values(100 * r + j, n)


def avg_reduce_scatter_all_to_all():
    # AVG: the documented SUM divided by the world size, bitwise.
    t = values(rank)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    expect_equal(t, documented_sum(HOSTS) / world, "all_reduce AVG")
    expect_raises("floating", lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32),
                                                      op=dist.ReduceOp.AVG))
    # reduce_scatter: rank j gets its pieces reduced in the documented order.
    expected = (piece(0, rank) + piece(1, rank)) + (piece(2, rank) + piece(3, rank))
    out = torch.zeros(300)
    dist.reduce_scatter(out, [piece(rank, j) for j in range(world)])
    expect_equal(out, expected, "reduce_scatter SUM")
    out = torch.zeros(300)
    dist.reduce_scatter(out, [piece(rank, j) for j in range(world)], op=dist.ReduceOp.MAX)
    expect_equal(out, torch.maximum(torch.maximum(piece(0, rank), piece(1, rank)),
                                    torch.maximum(piece(2, rank), piece(3, rank))),
                 "reduce_scatter MAX")
    out = torch.zeros(300)
    dist._reduce_scatter_base(out, torch.cat([piece(rank, j) for j in range(world)]))
    expect_equal(out, expected, "reduce_scatter_tensor SUM")
    out = torch.zeros(300)
    dist._reduce_scatter_base(out, torch.cat([piece(rank, j) for j in range(world)]),
                              op=dist.ReduceOp.AVG)
    expect_equal(out, expected / world, "reduce_scatter_tensor AVG")
    # all_to_all_single, equal and unequal splits: rank r sends r + j + 1 elements to j.
    inp = torch.arange(world * 2, dtype=torch.int64) + 100 * rank
    out = torch.zeros(world * 2, dtype=torch.int64)
    dist.all_to_all_single(out, inp)
    expect_equal(out, torch.cat([torch.arange(2 * rank, 2 * rank + 2, dtype=torch.int64) + 100 * r
                                 for r in range(world)]), "all_to_all_single")
    sends = [rank + j + 1 for j in range(world)]
    inp = torch.cat([torch.full((n,), 10.0 * rank + j) for j, n in enumerate(sends)])
    gets = [r + rank + 1 for r in range(world)]
    out = torch.zeros(sum(gets))
    dist.all_to_all_single(out, inp, gets, sends)
    expect_equal(out, torch.cat([torch.full((n,), 10.0 * r + rank) for r, n in enumerate(gets)]),
                 "all_to_all_single with splits")
    outs = [torch.zeros(r + 1) for r in range(world)]
    dist.all_to_all(outs, [torch.full((rank + 1,), 10.0 * rank + j) for j in range(world)])
    for r in range(world):
        expect_equal(outs[r], torch.full((r + 1,), 10.0 * r + rank), f"all_to_all from {r}")


def refusals():
    expect_raises("across hosts", lambda: dist.all_gather_coalesced(
        [[torch.zeros(1) for _ in range(world)]], [torch.zeros(1)]))


def batch_isend_irecv_mixed():
    """Every rank sends to and receives from every other rank in one batch (a peer on its
    host and two on the other), receives listed first, two messages per pair (in order), and
    large enough not to fit a ring at once."""
    n = 300_000
    peers = [r for r in range(world) if r != rank]
    got = {(p, k): torch.zeros(n) for p in peers for k in range(2)}
    ops = [dist.P2POp(dist.irecv, got[(p, k)], p) for p in peers for k in range(2)]
    ops += [dist.P2POp(dist.isend, torch.full((n,), 100.0 * rank + 10 * p + k), p)
            for p in reversed(peers) for k in range(2)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    for (p, k), t in got.items():
        expect_equal(t, torch.full((n,), 100.0 * p + 10 * rank + k), f"from {p} #{k}")


def coalescing_manager():
    """torch 2's _coalescing_manager: point-to-point with a device (each posted, the manager's
    Work waits for all), and its fast path of all_reduce / all_gather_into_tensor /
    reduce_scatter_tensor (the *_coalesced forms), with the bits of the single calls."""
    if not TORCH2:
        return
    from torch.distributed.distributed_c10d import _coalescing_manager
    pg = c10d._get_default_group()
    to, frm = (rank + 1) % world, (rank - 1) % world
    got = torch.zeros(4)
    with _coalescing_manager(pg, torch.device("cpu"), async_ops=True) as cm:
        dist.irecv(got, frm)
        dist.isend(torch.full((4,), float(rank)), to)
    cm.wait()
    expect_equal(got, torch.full((4,), float(frm)), "p2p in _coalescing_manager")
    ts = [values(rank), values(rank + 10, 10)]
    with _coalescing_manager(pg):
        for t in ts:
            dist.all_reduce(t)
    expect_equal(ts[0], documented_sum(HOSTS), "coalesced all_reduce [0]")
    outs = [torch.zeros(2 * world), torch.zeros(3 * world)]
    with _coalescing_manager(pg):
        dist.all_gather_into_tensor(outs[0], torch.full((2,), float(rank)))
        dist.all_gather_into_tensor(outs[1], torch.full((3,), float(rank)))
    expect_equal(outs[1], torch.arange(float(world)).repeat_interleave(3), "coalesced gather")
    out = torch.zeros(300)
    with _coalescing_manager(pg):
        dist.reduce_scatter_tensor(out, torch.cat([piece(rank, j) for j in range(world)]))
    expect_equal(out, (piece(0, rank) + piece(1, rank)) + (piece(2, rank) + piece(3, rank)),
                 "coalesced reduce_scatter_tensor")


def monitored_barrier_passes():
    dist.monitored_barrier(timeout=timedelta(seconds=60))
    dist.monitored_barrier(timeout=timedelta(seconds=60), wait_all_ranks=True)
    across = dist.new_group([1, 2, 3])
    if rank in (1, 2, 3):
        dist.monitored_barrier(group=across, timeout=timedelta(seconds=60))


def any_source_blocking():
    """Rank 0 receives with src=None the 20 messages each of rank 1 (its host) and ranks
    2 and 3 (the other host), sent at once: each exactly once, each source's in the order
    sent, the returned source the sender's; then a named receive from rank 2 while the
    mailbox may still hold a receive posted on the other transport (tag 0 again; rank 2 sends
    it once rank 0 is done with the others)."""
    n = 20
    if rank == 0:
        seen = {1: [], 2: [], 3: []}
        for _ in range(3 * n):
            t = torch.zeros(4)
            src = dist.recv(t)
            expect(src in seen, f"recv(src=None) returned source {src}")
            expect_equal(t, torch.full((4,), 100.0 * src + len(seen[src])),
                         f"message {len(seen[src])} of rank {src}")
            seen[src].append(int(t[0].item()))
        dist.send(torch.zeros(1), 2, tag=1)  # rank 2's last message only now
        t = torch.zeros(4)
        dist.recv(t, 2)
        expect_equal(t, torch.full((4,), 299.0), "the named receive after any-source ones")
    else:
        for k in range(n):
            dist.send(torch.full((4,), 100.0 * rank + k), 0)
        if rank == 2:
            dist.recv(torch.zeros(1), 0, tag=1)
            dist.send(torch.full((4,), 299.0), 0)
    dist.barrier()


def any_source_irecv_order():
    """Rank 2 posts irecv(src=None), irecv(src=3), irecv(src=None) (tag 5) and waits for them
    in reverse order; rank 3 (its host) sends a then b, rank 0 (the other host) c after a
    barrier. Every message is taken once, the named receive gets one of rank 3's, and rank
    3's messages go to the receives in the order they were posted (MPI's matching)."""
    if rank == 2:
        got = [torch.zeros(2) for _ in range(3)]
        works = [dist.irecv(got[0], tag=5), dist.irecv(got[1], 3, tag=5),
                 dist.irecv(got[2], tag=5)]
        dist.barrier()
        for w in reversed(works):
            w.wait()
        values_got = [t[0].item() for t in got]
        expect(sorted(values_got) == [1.0, 2.0, 3.0], f"received {values_got}")
        expect(values_got[1] in (1.0, 2.0), f"the named receive from 3 got {values_got[1]}")
        from3 = [v for v in values_got if v in (1.0, 2.0)]
        expect(from3 == [1.0, 2.0], f"rank 3's messages taken as {values_got}")
        sources = [w._source_rank() for w in works]
        expect(sorted(sources) == [0, 3, 3], f"sources {sources}")
    elif rank == 3:
        dist.send(torch.full((2,), 1.0), 2, tag=5)
        dist.send(torch.full((2,), 2.0), 2, tag=5)
        dist.barrier()
    elif rank == 0:
        dist.barrier()
        dist.send(torch.full((2,), 3.0), 2, tag=5)
    else:
        dist.barrier()
    dist.barrier()


if mode == "more":
    from common import TORCH2  # noqa: E402
    run_checks([batch_isend_irecv_mixed, coalescing_manager, monitored_barrier_passes,
                any_source_blocking, any_source_irecv_order])
    dist.barrier()
    dist.destroy_process_group()
    say(f"DONE rank={rank}")
    sys.exit(0)

run_checks([group_is_hosts, all_reduce_documented_order, reduce_to_each, broadcast_from_each,
            p2p_ring, all_gather_and_barrier, sub_groups, avg_reduce_scatter_all_to_all,
            refusals])
dist.barrier()
dist.destroy_process_group()
say(f"DONE rank={rank}")
