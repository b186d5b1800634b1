"""Backend "shm" across hosts (issue 30): which ranks share a host, and the process group
that joins the hosts ("shm" inside each host, gloo between hosts). docs/hosts.md says what
works and what is refused.

Which ranks share a host is found by the machine, not by launcher variables or host names:
every rank creates a small object in /dev/shm holding 128 random bits (a probe), publishes
its name and bits through the group's store, and opens the other ranks' probes; the ranks
whose bits it reads share its /dev/shm, which is what "shm" needs. Two containers or mount
namespaces with separate /dev/shm on one machine are two hosts; one host with many agents is
one. The probes are removed as soon as every rank has looked (and on every failure).
"""

import functools
import os
import re
import secrets
import threading
import time
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

from . import _C

# The store keys of the probe, under the group's store (torch gives every group a store
# prefixed with its name). <gen> counts this rank's probes on the store: a store reused by a
# later job (an elastic restart, a file:// store) holds earlier entries, which a later probe
# must not read as this one's.
_KEY = "shmdist/hosts/"


def _shm_tag():
    tag = os.environ.get("SHMDIST_SHM_TAG", "")
    if tag and not re.fullmatch(r"[A-Za-z0-9_]{1,32}", tag):
        raise _C.InvalidArgument("SHMDIST_SHM_TAG is '" + tag + "': expected 1 to 32 letters, "
                                 "digits or '_'; set it so, or unset it")
    return tag


def _probe_name(tag):
    """ "shmdist-<uid>-[<tag>-]hp-<128 random bits>", named as lib/pg names its objects
    (shm_object_name), so a test harness's leak check sees it."""
    return "shmdist-" + str(os.getuid()) + "-" + (tag + "-" if tag else "") + "hp-" + \
        secrets.token_hex(16)


def _one_host_by_launcher():
    """Whether the launcher says, beyond doubt, that every rank is on this host: shmrun
    (which hands its ranks the job's segment, SHMDIST_SEGMENT_FD) starts ranks on one host."""
    return "SHMDIST_SEGMENT_FD" in os.environ


class _Probe:
    """The store side of one probe: waits for the other ranks' entries, and tells them when
    this rank finds the job cannot form, so that every rank fails at once with the cause
    instead of waiting out the timeout for a rank that gave up."""

    _SLICE = timedelta(milliseconds=100)

    def __init__(self, store, prefix, rank, size, timeout, global_rank):
        self.store, self.prefix, self.rank, self.size = store, prefix, rank, size
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout.total_seconds()
        self.me = "rank " + str(rank) + " (global rank " + str(global_rank) + ")"
        # The error, and a counter that is nonzero once it is set (torch 1.13's stores have
        # no check(); add(key, 0) reads a counter on every store).
        self.error_key = prefix + "error"
        self.failed_key = prefix + "failed"
        self.acks_key = prefix + "failed_seen"

    # How long a failing rank waits for the others to read its error before it raises: the
    # store may live in its process (env:// keeps it in rank 0's), and leaves with it.
    _TELL = 5.0

    def fail(self, why):
        """Raises SetupError(why) here, and on every rank waiting in this probe."""
        try:
            self.store.set(self.error_key, why)
            self.store.add(self.failed_key, 1)  # after the set: a reader sees the error
            # Every rank that raises counts itself once (here or in get); wait, bounded, until
            # all have, so that none finds the store gone instead of the cause.
            self.store.add(self.acks_key, 1)
            deadline = time.monotonic() + self._TELL
            while (self.store.add(self.acks_key, 0) < self.size and
                   time.monotonic() < deadline):
                time.sleep(0.02)
        finally:
            raise _C.SetupError(why)

    def get(self, key, what):
        """The value of `key` once some rank set it; raises SetupError when another rank
        reported a failure, or at the timeout."""
        while True:
            if self.store.add(self.failed_key, 0) > 0:
                error = self.store.get(self.error_key).decode()
                self.store.add(self.acks_key, 1)  # after reading: the failing rank may leave
                raise _C.SetupError(error + " (reported to " + self.me + " through the store)")
            began = time.monotonic()
            try:
                self.store.wait([key], self._SLICE)
                return self.store.get(key).decode()
            except RuntimeError as e:
                if time.monotonic() - began < self._SLICE.total_seconds() / 2:
                    raise  # not the slice's timeout: the store itself failed
                if time.monotonic() >= self.deadline:
                    self.fail(self.me + ": " + what + " within the timeout of " +
                              str(self.timeout) + "; check that every rank was started with "
                              "the same world size (" + str(self.size) + ") and all of them "
                              "run (the store says: " + str(e).splitlines()[0] + ")")


def find_hosts(store, rank, size, timeout, global_ranks):
    """The ranks of the group grouped by host: a list of hosts, each the sorted list of its
    group ranks, hosts ordered by their lowest rank; and the store prefix of this probe (for
    the groups made next). Every member calls it with the same store; it leaves nothing in
    /dev/shm, also when it raises."""
    gen = store.add(_KEY + "gen/" + str(rank), 1)
    prefix = _KEY + str(gen) + "/"
    probe = _Probe(store, prefix, rank, size, timeout, global_ranks[rank])
    name = _probe_name(_shm_tag())
    token = secrets.token_hex(16)
    path = "/dev/shm/" + name
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            os.write(fd, token.encode())
        finally:
            os.close(fd)
        store.set(prefix + "probe/" + str(rank), str(size) + " " + name + " " + token)
        mates = []
        for r in range(size):
            text = probe.get(prefix + "probe/" + str(r),
                             "rank " + str(r) + " did not publish its host probe")
            fields = text.split(" ")
            if len(fields) != 3 or not fields[1].startswith("shmdist-") or "/" in fields[1]:
                probe.fail("the store's host probe of rank " + str(r) + " is '" + text +
                           "': expected '<world size> <name> <token>' written by shmdist; is "
                           "another program using the same store?")
            if fields[0] != str(size):
                probe.fail("rank " + str(r) + " was started with a world (group) size of " +
                           fields[0] + " but " + probe.me + " with " + str(size) + "; start "
                           "every rank with the same world size")
            if r == rank or _reads(fields[1], fields[2]):
                mates.append(r)
        store.set(prefix + "host/" + str(rank), ",".join(map(str, mates)))
        # Every rank has looked at every probe once all have published what they saw.
        rows = {r: tuple(int(x) for x in probe.get(
                    prefix + "host/" + str(r),
                    "rank " + str(r) + " did not report which probes it could read").split(","))
                for r in range(size)}
    finally:
        _unlink(path)
    hosts = [list(rows[r]) for r in range(size) if rows[r][0] == r]  # r: its host's lowest
    placed = sorted(r for host in hosts for r in host)
    for host in hosts:
        for r in host:
            if rows[r] != tuple(host) or placed != list(range(size)):
                raise _C.SetupError(
                    "ranks disagree on who shares a host: rank " + str(host[0]) + " reads "
                    "the probes of ranks " + str(host) + " in /dev/shm, rank " + str(r) +
                    " those of " + str(list(rows[r])) + "; is /dev/shm shared in part (a "
                    "bind mount, another user's tmpfs)? Give every host one /dev/shm")
    return hosts, prefix


def _reads(name, token):
    try:
        fd = os.open("/dev/shm/" + name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False  # not in this /dev/shm: another host
    try:
        return os.read(fd, 64).decode(errors="replace") == token
    finally:
        os.close(fd)


def _unlink(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


# --- the process group across hosts -------------------------------------------------------

def _done(result):
    """A completed Work returning `result` (the composite's collectives run to completion
    before they return)."""
    fut = torch.futures.Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


def _kind(op):
    """A ReduceOp's kind as an int (torch 1.13's dist.ReduceOp.SUM is a ReduceOp, torch 2's a
    ReduceOp.RedOpType; both have the same number)."""
    return int(getattr(op, "op", op))


_AVG = _kind(dist.ReduceOp.AVG)

# How the leaders combine two host partials, by the ReduceOp's kind.
_COMBINE = {
    _kind(dist.ReduceOp.SUM): torch.add,
    _kind(dist.ReduceOp.PRODUCT): torch.mul,
    _kind(dist.ReduceOp.MIN): torch.minimum,
    _kind(dist.ReduceOp.MAX): torch.maximum,
    _kind(dist.ReduceOp.BAND): torch.bitwise_and,
    _kind(dist.ReduceOp.BOR): torch.bitwise_or,
    _kind(dist.ReduceOp.BXOR): torch.bitwise_xor,
}

# The dtypes whose SUM of two host partials goes through the leaders' gloo all_reduce
# (ProcessGroupHosts._combine_hosts): gloo sums them in their own type, as torch.add does.
_SUM_OVER_GLOO = (torch.float32, torch.float64, torch.int32, torch.int64)


def _refuse(op, why=""):
    raise _C.InvalidArgument(
        "shm backend: " + op + " across hosts is not supported yet" + (": " + why if why else "")
        + " (docs/hosts.md lists what is); keep the group on one host, or use backend gloo "
        "for it")


class _Deaths:
    """The job's record of a rank that died, in the store, so that the survivors on every host
    raise PeerFailure naming it, not the error that reached them second hand (gloo's "connection
    closed", a host mate that left after the death, the timeout).

    Who writes it: a rank whose host's "shm" job saw one of its ranks end abnormally (that
    job's PeerFailure names the global rank, 30.1): its failing call, or its watcher thread
    (below) when it is not in a call. Who reads it: a call that fails, and the watcher, which
    keeps the text, so a rank can name the cause after the store is gone (env:// keeps the store
    in rank 0's process). A healthy job pays nothing per call: a call reads the record only
    after it failed; the watcher polls this host's segment (no system call) and the store's
    counter four times a second."""

    POLL = 0.25  # s, the watcher's period
    SETTLE = 3.0  # s a failed call waits for the record (the death's host mates report it)

    def __init__(self, store, prefix):
        self.store = store
        self.count_key = prefix + "dead/count"
        self.text_key = prefix + "dead/text"
        self.text = None  # the record, once seen (a str is replaced whole: safe across threads)
        self.watching = True

    def read(self):
        """The record's text, or None; None also when the store is unreachable."""
        if self.text is None:
            try:
                # The count is raised after the text is set: a count above 0 means a text.
                if self.store.add(self.count_key, 0) > 0:
                    self.text = self.store.get(self.text_key).decode()
            except RuntimeError:
                pass
        return self.text

    def local(self, what):
        """PeerFailure if a rank of this host's world "shm" job ended abnormally (published
        first), else None."""
        try:
            _C._check_world_peers(what)
        except _C.PeerFailure as e:
            self.publish(str(e))
            return e
        return None

    def publish(self, text):
        if self.read() is not None:
            return
        self.text = text
        try:
            self.store.set(self.text_key, text)
            self.store.add(self.count_key, 1)
        except RuntimeError:
            pass

    def failure(self, error, what):
        """What a call `what` that failed with `error` raises: PeerFailure naming the rank
        that died, if one did, else `error`."""
        text = self.read()
        if text is None:
            local = self.local(what)
            if local is not None:
                return local
            deadline = time.monotonic() + self.SETTLE
            while text is None and time.monotonic() < deadline:
                time.sleep(0.05)
                text = self.read()
        if text is None:
            return error
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        if text == str(error):
            return error
        return _C.PeerFailure(text + " [on another host or before this call; this rank's " +
                              what + " failed with: " + first + "]")

    def watch(self, world_ref):
        """The watcher thread's loop, while the world group lives and has a "shm" job."""
        while self.watching and world_ref() is not None and self.text is None:
            try:
                if not _C._check_world_peers("watching the host's ranks"):
                    return  # the host's job is gone (destroyed)
            except _C.PeerFailure as e:
                self.publish(str(e))
                return
            if self.read() is not None:
                return
            time.sleep(self.POLL)


def _watched(what):
    """Makes a failing call raise PeerFailure naming a rank that died anywhere (_Deaths)."""
    def wrap(method):
        @functools.wraps(method)
        def call(self, *args, **kwargs):
            try:
                return method(self, *args, **kwargs)
            except _C.InvalidArgument:
                raise
            except RuntimeError as e:
                if self.deaths is None:
                    raise
                raise self.deaths.failure(e, what) from e
        return call
    return wrap


_Work = getattr(dist, "_Work", None) or torch._C._distributed_c10d.Work


class _WatchedWork(_Work):
    """gloo's Work of a send or recv across hosts, whose wait raises as _watched says (its
    error comes at wait, after the call returned)."""

    def __init__(self, inner, deaths, what):
        super().__init__()
        self.inner, self.deaths, self.what = inner, deaths, what

    def wait(self, timeout=None):
        try:
            return self.inner.wait() if timeout is None else self.inner.wait(timeout)
        except _C.InvalidArgument:
            raise
        except RuntimeError as e:
            raise self.deaths.failure(e, self.what) from e

    def is_completed(self):
        return self.inner.is_completed()

    def is_success(self):
        return self.inner.is_success()

    def exception(self):
        return self.inner.exception()

    def source_rank(self):
        return self.inner.source_rank()

    def result(self):
        return self.inner.result()


class ProcessGroupHosts(dist.ProcessGroup):
    """A torch process group whose members are on several hosts: "shm" among the members on
    this host (`local`, a group of backend "shm"), gloo among all members (`gloo`) and among
    one leader per host, the lowest rank of each (`leaders`, on leaders only).

    Reductions are hierarchical and deterministic: each host reduces its members in rank order
    (over "shm", to its leader); the leaders gather the host partials and combine them in host
    order (hosts ordered by their lowest rank), so every leader computes the same bits; then
    each leader broadcasts inside its host. With hosts [0, 1] and [2, 3], SUM is
    (x0 + x1) + (x2 + x3), bitwise equal on every rank."""

    def __init__(self, rank, size, hosts, local, gloo, leaders, global_ranks):
        super().__init__(rank, size)
        self.hosts = hosts
        self._host_of = {r: h for h, host in enumerate(hosts) for r in host}
        self._host = self._host_of[rank]
        self._local_rank = {r: i for host in hosts for i, r in enumerate(host)}
        self.local = local
        self.gloo = gloo
        self.leaders = leaders
        self.global_ranks = list(global_ranks)
        self.deaths = None  # the world's _Deaths (set by the creator)

    def getBackendName(self):
        return "shm"

    def __repr__(self):
        return "ProcessGroupHosts(rank=" + str(self.rank()) + ", size=" + str(self.size()) + \
            ", hosts=" + str(self.hosts) + ")"

    def _local_peer(self, peer):
        """The local group's rank of group rank `peer` if it is on this host, else None."""
        if not 0 <= peer < self.size():
            raise _C.InvalidArgument("shm backend: peer " + str(peer) + " is not a rank of "
                                     "this group of " + str(self.size()) + " ranks")
        return self._local_rank[peer] if self._host_of[peer] == self._host else None

    @staticmethod
    def _one(tensors, op):
        if len(tensors) != 1:
            raise _C.InvalidArgument("shm backend: " + op + " takes one tensor per call, got " +
                                     str(len(tensors)))
        return tensors[0]

    # point-to-point: a peer on this host over "shm", another host's over gloo

    @_watched("send")
    def send(self, tensors, dst, tag=0):
        local = self._local_peer(dst)
        if local is None:
            work = self.gloo.send(tensors, dst, tag)
            return work if self.deaths is None else _WatchedWork(work, self.deaths, "send")
        return self.local.send(tensors, local, tag)

    @_watched("recv")
    def recv(self, tensors, src, tag=0):
        local = self._local_peer(src)
        if local is None:
            work = self.gloo.recv(tensors, src, tag)
            return work if self.deaths is None else _WatchedWork(work, self.deaths, "recv")
        return self.local.recv(tensors, local, tag)

    def recv_anysource(self, tensors, tag=0):
        _refuse("recv from any source (src=None, ANY_SOURCE)", "name the source rank")

    # collectives

    @_watched("barrier")
    def barrier(self, opts=None):
        # Nobody leaves before everyone entered: a leader passes the leaders' barrier only once
        # every leader has, each after its host's members entered; members leave after it.
        self.local.barrier().wait()
        if self.leaders is not None:
            self.leaders.barrier().wait()
        self.local.barrier().wait()
        return _done([])

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        _refuse("monitored_barrier", "use barrier")

    def _combine_hosts(self, tensor, op):
        """On a leader: the host partials gathered and combined in host order, into tensor."""
        if len(self.hosts) == 2 and _kind(op) == _kind(dist.ReduceOp.SUM) and \
                tensor.dtype in _SUM_OVER_GLOO and tensor.is_contiguous() and \
                not tensor.is_conj() and not tensor.is_neg():
            # Two partials: each element is one addition p0 + p1, which gives the same bits
            # as p1 + p0, so gloo's all_reduce of the two leaders computes exactly the host
            # order's sum, each element once, on one leader, sent to the other (bitwise equal
            # on both). It works in place: the all-gather below allocates and fills a buffer
            # per host and gloo copies through two more, which at 16 MiB cost more than gloo's
            # whole 4-rank all_reduce (docs/hosts.md).
            self.leaders.allreduce([tensor]).wait()
            return
        parts = [torch.empty_like(tensor) for _ in self.hosts]
        self.leaders.allgather([parts], [tensor]).wait()
        acc = parts[0]
        combine = _COMBINE[_kind(op)]
        for part in parts[1:]:
            acc = combine(acc, part)
        tensor.copy_(acc)

    def _check_op(self, opts, what, tensors=()):
        kind = _kind(opts.reduceOp)
        if kind == _AVG:
            for t in tensors:
                if not (t.is_floating_point() or t.is_complex()):
                    raise _C.InvalidArgument(
                        "shm backend: " + what + " with ReduceOp.AVG is defined on floating "
                        "tensors only, not on " + str(t.dtype) + " (global rank " +
                        str(self.global_ranks[self.rank()]) + "); use SUM and divide")
            return opts.reduceOp
        if kind not in _COMBINE:
            _refuse(what + " with reduce op " + str(getattr(opts.reduceOp, "op", opts.reduceOp)),
                    "SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR and BXOR are")
        return opts.reduceOp

    def _allreduce_one(self, tensor, op):
        # AVG: the SUM in the documented order, divided by the group's size on each leader
        # (in the tensor's dtype) before it broadcasts: every rank gets the same bits.
        avg = _kind(op) == _AVG
        if avg:
            op = dist.ReduceOp.SUM
        self.local.reduce([tensor], _reduce_opts(0, op)).wait()
        if self.leaders is not None:
            self._combine_hosts(tensor, op)
            if avg:
                tensor.div_(self.size())
        self.local.broadcast([tensor], _broadcast_opts(0)).wait()

    @_watched("all_reduce")
    def allreduce(self, tensors, opts=None):
        tensor = self._one(tensors, "all_reduce")
        op = self._check_op(opts if opts is not None else dist.AllreduceOptions(), "all_reduce",
                            [tensor])
        self._allreduce_one(tensor, op)
        return _done([tensor])

    @_watched("all_reduce_coalesced")
    def allreduce_coalesced(self, tensors, opts=None):
        op = self._check_op(opts if opts is not None else dist.AllreduceCoalescedOptions(),
                            "all_reduce_coalesced", tensors)
        for tensor in tensors:
            self._allreduce_one(tensor, op)
        return _done(list(tensors))

    @_watched("reduce")
    def reduce(self, tensors, opts=None):
        tensor = self._one(tensors, "reduce")
        op = self._check_op(opts, "reduce", [tensor])
        result = tensor.clone()
        self._allreduce_one(result, op)
        if self.rank() == opts.rootRank:
            tensor.copy_(result)
        return _done([tensor])

    @_watched("broadcast")
    def broadcast(self, tensors, opts=None):
        src = opts.rootRank if opts is not None else 0
        self._local_peer(src)
        src_host = self._host_of[src]
        # src's host first (its leader included), then the leaders, then the other hosts.
        if self._host == src_host:
            self.local.broadcast(tensors, _broadcast_opts(self._local_rank[src])).wait()
        if self.leaders is not None:
            self.leaders.broadcast(tensors, _broadcast_opts(src_host)).wait()
        if self._host != src_host:
            self.local.broadcast(tensors, _broadcast_opts(0)).wait()
        return _done(list(tensors))

    # Operations that only move data go over gloo among all members: exact, as "shm"'s.

    @_watched("all_gather")
    def allgather(self, output_tensors, input_tensors, opts=None):
        return self.gloo.allgather(output_tensors, input_tensors)

    @_watched("all_gather_into_tensor")
    def _allgather_base(self, output, input, opts=None):
        outputs = list(output.chunk(self.size()))
        if not outputs or any(o.shape != input.shape for o in outputs):
            raise _C.InvalidArgument("shm backend: all_gather_into_tensor takes an output of "
                                     "world size x the input's size, got " +
                                     str(tuple(output.shape)) + " for an input of " +
                                     str(tuple(input.shape)))
        staging = [torch.empty_like(input) for _ in range(self.size())]
        self.gloo.allgather([staging], [input]).wait()
        for o, s in zip(outputs, staging):
            o.copy_(s)
        return _done([output])

    def all_gather_single(self, output, input, opts=None):  # torch 2.13's all_gather_into_tensor
        return self._allgather_base(output, input, opts)

    @_watched("gather")
    def gather(self, output_tensors, input_tensors, opts=None):
        o = dist.GatherOptions()
        o.rootRank = opts.rootRank
        return self.gloo.gather(output_tensors, input_tensors, o)

    @_watched("scatter")
    def scatter(self, output_tensors, input_tensors, opts=None):
        o = dist.ScatterOptions()
        o.rootRank = opts.rootRank
        return self.gloo.scatter(output_tensors, input_tensors, o)

    # all_to_all only moves data: over gloo among all members (its all_to_all_single; the
    # list form travels as one flat tensor of each rank's pieces).

    @_watched("all_to_all_single")
    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        self.gloo.alltoall_base(output, input, list(output_split_sizes),
                                list(input_split_sizes), dist.AllToAllOptions()).wait()
        return _done([output])

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes,
                          opts=None):  # torch 2.13's name
        return self.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)

    @_watched("all_to_all")
    def alltoall(self, output_tensors, input_tensors, opts=None):
        n = self.size()
        if len(output_tensors) != n or len(input_tensors) != n:
            raise _C.InvalidArgument(
                "shm backend: all_to_all takes " + str(n) + " output and " + str(n) + " input "
                "tensors (one per rank), got " + str(len(output_tensors)) + " and " +
                str(len(input_tensors)))
        dtypes = {t.dtype for t in list(output_tensors) + list(input_tensors)}
        if len(dtypes) != 1:
            raise _C.InvalidArgument("shm backend: all_to_all takes tensors of one dtype, got " +
                                     str(sorted(map(str, dtypes))))
        flat_in = torch.cat([t.reshape(-1) for t in input_tensors])
        flat_out = torch.empty(sum(t.numel() for t in output_tensors), dtype=flat_in.dtype)
        self.gloo.alltoall_base(flat_out, flat_in, [t.numel() for t in output_tensors],
                                [t.numel() for t in input_tensors],
                                dist.AllToAllOptions()).wait()
        for o, piece in zip(output_tensors, flat_out.split([t.numel() for t in output_tensors])):
            o.copy_(piece.view(o.shape))
        return _done(list(output_tensors))

    # reduce_scatter: the inputs reduced as all_reduce reduces (the same documented order,
    # hence the same bits as all_reduce of the same inputs), each rank keeping its piece. It
    # moves the whole input through the hierarchy, as all_reduce does.

    def _reduce_scatter_flat(self, pieces, flat, opts, what):
        """Reduces `flat` (every rank's pieces, rank order) and copies rank r's piece to
        pieces[r] on this rank (only this rank's entry is written)."""
        op = self._check_op(opts if opts is not None else dist.ReduceScatterOptions(), what,
                            [flat])
        self._allreduce_one(flat, op)
        mine = pieces[self.rank()]
        offset = sum(p.numel() for p in pieces[:self.rank()])
        mine.copy_(flat[offset:offset + mine.numel()].view(mine.shape))

    @_watched("reduce_scatter")
    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        output = self._one(output_tensors, "reduce_scatter")
        inputs = self._one(input_tensors, "reduce_scatter")
        if len(inputs) != self.size() or any(t.shape != output.shape or t.dtype != output.dtype
                                               for t in inputs):
            raise _C.InvalidArgument(
                "shm backend: reduce_scatter takes " + str(self.size()) + " inputs of the "
                "output's shape " + str(tuple(output.shape)) + " and dtype " +
                str(output.dtype) + ", got " + str([(tuple(t.shape), str(t.dtype))
                                                    for t in inputs]))
        flat = torch.cat([t.reshape(-1) for t in inputs])
        pieces = [output if r == self.rank() else t for r, t in enumerate(inputs)]
        self._reduce_scatter_flat(pieces, flat, opts, "reduce_scatter")
        return _done([output])

    @_watched("reduce_scatter_tensor")
    def _reduce_scatter_base(self, output, input, opts=None):
        if (input.numel() != output.numel() * self.size() or input.dtype != output.dtype):
            raise _C.InvalidArgument(
                "shm backend: reduce_scatter_tensor takes an input of world size (" +
                str(self.size()) + ") x the output's elements, of its dtype; got " +
                str(tuple(input.shape)) + " " + str(input.dtype) + " for an output of " +
                str(tuple(output.shape)) + " " + str(output.dtype))
        flat = input.reshape(-1).clone()
        pieces = [output] * self.size()
        self._reduce_scatter_flat(pieces, flat, opts, "reduce_scatter_tensor")
        return _done([output])

    def reduce_scatter_single(self, output, input, opts=None):  # torch 2.13's name
        return self._reduce_scatter_base(output, input, opts)

    def allgather_coalesced(self, *args, **kwargs):
        _refuse("all_gather_coalesced")

    # torch 2.x's names for more of the same, and its coalescing (batch_isend_irecv, FSDP's
    # _coalescing_manager): without these a call would reach torch's ProcessGroup, which has no
    # backend here, and say "No backend type associated with device type cpu".

    def reduce_scatter_single_coalesced(self, *args, **kwargs):
        _refuse("reduce_scatter_tensor_coalesced")

    def reduce_scatter_tensor_coalesced(self, *args, **kwargs):
        _refuse("reduce_scatter_tensor_coalesced")

    def allgather_into_tensor_coalesced(self, *args, **kwargs):
        _refuse("all_gather_into_tensor_coalesced")

    def all_gather_single_coalesced(self, *args, **kwargs):
        _refuse("all_gather_into_tensor_coalesced")

    def _start_coalescing(self, *args, **kwargs):
        _refuse("coalescing (batch_isend_irecv, _coalescing_manager)")

    def _end_coalescing(self, *args, **kwargs):
        _refuse("coalescing (batch_isend_irecv, _coalescing_manager)")


def _reduce_opts(root, op):
    o = dist.ReduceOptions()
    o.rootRank = root
    o.reduceOp = op
    return o


def _broadcast_opts(root):
    o = dist.BroadcastOptions()
    o.rootRank = root
    return o


# --- creating groups ----------------------------------------------------------------------

_world = None  # a weak reference to the world's ProcessGroupHosts, while it lives


def _world_across_hosts():
    return _world() if _world is not None else None


def create(store, rank, size, timeout, group_name, global_ranks_in_group):
    """The group torch asks backend "shm" for, if its members are on several hosts (a
    ProcessGroupHosts), else None: the caller then creates it on one host as before."""
    global _world
    ranks = list(global_ranks_in_group)
    world = _world_across_hosts()
    if ranks and world is not None:
        return _sub_group(world, store, rank, size, timeout, group_name, ranks)
    if ranks and _C._check_world_peers("creating a group of backend 'shm'"):
        return None  # a sub-group of a world on one host: it shares the world's segment
    # The group is a job of its own (the world, or a group whose world is not on "shm").
    if size == 1 or _one_host_by_launcher():
        return None
    hosts, prefix = find_hosts(store, rank, size, timeout, ranks or list(range(size)))
    if len(hosts) == 1:
        return None
    group = _compose(store, prefix, rank, size, timeout, group_name, hosts,
                     ranks or list(range(size)), world_job=not ranks)
    if not ranks:
        _world = weakref.ref(group)
        group.deaths = _Deaths(store, prefix)
        threading.Thread(target=group.deaths.watch, args=(_world,), daemon=True,
                         name="shmdist-hosts-watch").start()
    return group


def _compose(store, prefix, rank, size, timeout, group_name, hosts, global_ranks, world_job,
             local_ranks=None):
    """A ProcessGroupHosts over `hosts` (lists of group ranks). Its "shm" part is a job of its
    own per host (`local_ranks` None: the world's, or that of a group whose world is not on
    "shm") or a sub-group of this host's world job (`local_ranks`: the world job's ranks of
    this host's members, in group-rank order)."""
    h = next(i for i, host in enumerate(hosts) if rank in host)
    host = hosts[h]
    local_store = dist.PrefixStore(prefix + "host" + str(h) + "/", store)
    if local_ranks is not None:
        members = local_ranks
    else:
        # [] makes the C++ creator create the world's job (which its sub-groups map onto);
        # the ranks of a job that is not the world's are its own 0..n-1.
        members = [] if world_job else list(range(len(host)))
    # A job of its own names its ranks in errors by their global ranks (a sub-group's world
    # job already does).
    names = [global_ranks[r] for r in host] if local_ranks is None else []
    local = _C._create_process_group(local_store, host.index(rank), len(host), timeout,
                                     group_name, members, names)
    gloo = dist.ProcessGroupGloo(dist.PrefixStore(prefix + "gloo/", store), rank, size, timeout)
    leaders = None
    if rank == host[0]:
        leaders = dist.ProcessGroupGloo(dist.PrefixStore(prefix + "leaders/", store), h,
                                        len(hosts), timeout)
    return ProcessGroupHosts(rank, size, hosts, local, gloo, leaders, global_ranks)


def _sub_group(world, store, rank, size, timeout, group_name, ranks):
    """A sub-group of a world across hosts: on one host, a sub-group of that host's "shm" job
    (returned as the C++ creator makes it); across hosts, a ProcessGroupHosts whose "shm" part
    is such a sub-group."""
    by_host = {}
    for i, g in enumerate(ranks):
        by_host.setdefault(world._host_of[g], []).append(i)
    hosts = sorted(by_host.values())
    host = next(host for host in hosts if rank in host)
    local_ranks = [world._local_rank[ranks[i]] for i in host]
    if len(hosts) == 1:
        return _C._create_process_group(store, rank, size, timeout, group_name, local_ranks)
    group = _compose(store, _KEY, rank, size, timeout, group_name, hosts, ranks,
                     world_job=False, local_ranks=local_ranks)
    group.deaths = world.deaths
    return group
