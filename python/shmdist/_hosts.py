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

import atexit
import collections
import functools
import os
import queue
import re
import secrets
import struct
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

    # After this long waiting for ranks (or half the timeout, if shorter), a rank says once
    # (stderr) which have not come yet.
    _SAY_AFTER = 10.0

    def __init__(self, store, prefix, rank, size, timeout, global_ranks):
        self.store, self.prefix, self.rank, self.size = store, prefix, rank, size
        self.timeout = timeout
        self.began = time.monotonic()
        self.deadline = self.began + timeout.total_seconds()
        self.global_ranks = global_ranks
        self.me = "rank " + str(rank) + " (global rank " + str(global_ranks[rank]) + ")"
        self.said = False
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

    def here(self, stage):
        """Counts this rank as having done `stage` (a counter per rank: add never blocks, on
        every store, so a rank can later list who has not without waiting for them)."""
        self.store.add(self.prefix + stage + "/here/" + str(self.rank), 1)

    def missing(self, stage):
        """The group ranks that have not done `stage` yet."""
        return [r for r in range(self.size)
                if self.store.add(self.prefix + stage + "/here/" + str(r), 0) == 0]

    def _who(self, ranks):
        return "ranks " + str(ranks) + " (global ranks " + \
            str([self.global_ranks[r] for r in ranks]) + ")"

    def get(self, r, what, stage):
        """The value rank r set for `stage` (key <prefix><stage>/<r>) once it has; raises
        SetupError when another rank reported a failure, or at the timeout, naming every rank
        that has not done `stage` (`what` says what it is).

        It polls rank r's counter (Probe.here, after its set) with add(key, 0), which never
        blocks, rather than waiting on the key with store.wait in short slices: torch 1.13's
        TCPStore times such a wait out on the client's socket, and the server's late answer is
        then read as the answer to the next request, so the probe read wrong values and waited
        out the whole timeout (a rank of a job that could form failed about 1 run in 4)."""
        delay = 0.001
        while True:
            if self.store.add(self.failed_key, 0) > 0:
                error = self.store.get(self.error_key).decode()
                self.store.add(self.acks_key, 1)  # after reading: the failing rank may leave
                raise _C.SetupError(error + " (reported to " + self.me + " through the store)")
            if self.store.add(self.prefix + stage + "/here/" + str(r), 0) > 0:
                return self.store.get(self.prefix + stage + "/" + str(r)).decode()
            now = time.monotonic()
            if now >= self.deadline:
                missing = self.missing(stage)
                here = [q for q in range(self.size) if q not in missing]
                self.fail(self.me + ": " + self._who(missing) + " of the " + str(self.size) +
                          " did not " + what + " within the timeout of " + str(self.timeout) +
                          " (" + self._who(here) + " did): they never reached the creation "
                          "of backend \"shm\"; check that every host's ranks (or agent) "
                          "started, with the same world size (" + str(self.size) + "), and "
                          "did not fail before init_process_group")
            if not self.said and now - self.began >= min(
                    self._SAY_AFTER, self.timeout.total_seconds() / 2):
                self.said = True
                missing = self.missing(stage)
                import sys
                sys.stderr.write(
                    "shmdist: " + self.me + " has waited " + str(int(now - self.began)) +
                    " s in the creation of backend \"shm\" for " + self._who(missing) +
                    " of the " + str(self.size) + " to " + what + "; it waits up to the "
                    "timeout (" + str(self.timeout) + "). Are all hosts' ranks started?\n")
            time.sleep(delay)
            delay = min(delay * 2, 0.05)  # a rank late by seconds costs 20 requests a second


def find_hosts(store, rank, size, timeout, global_ranks):
    """The ranks of the group grouped by host: a list of hosts, each the sorted list of its
    group ranks, hosts ordered by their lowest rank; and the store prefix of this probe (for
    the groups made next). Every member calls it with the same store; it leaves nothing in
    /dev/shm, also when it raises."""
    gen = store.add(_KEY + "gen/" + str(rank), 1)
    prefix = _KEY + str(gen) + "/"
    probe = _Probe(store, prefix, rank, size, timeout, global_ranks)
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
        probe.here("probe")
        mates = []
        for r in range(size):
            text = probe.get(r, "publish their host probe", "probe")
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
        probe.here("host")
        # Every rank has looked at every probe once all have published what they saw.
        rows = {r: tuple(int(x) for x in probe.get(
                    r, "report which host probes they could read", "host").split(","))
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


_OP_NAMES = {_kind(getattr(dist.ReduceOp, n)): n for n in
             ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")}


def _disagree(text):
    """InvalidArgument(text), marked as naming global ranks already (_watched leaves it)."""
    e = _C.InvalidArgument(text)
    e.named_globally = True
    return e


class _Agreement:
    """Issue 30: the members of a collective across hosts agree on it before any gloo message
    whose size could differ is sent (gloo waits out the timeout for a call that never comes,
    or aborts the process, SIGABRT, on a message of another size).

    Every collective meets the other hosts at one place: a gloo all_gather among the leaders
    (the lowest rank of each host) of one FRAME of fixed size: the leader's call described in
    text ("all_reduce(op=SUM, torch.float32, 4 elements)"; "!<error>" when its host failed
    inside), then up to SMALL bytes of payload. Equal sizes, so gloo never sees a size
    mismatch whatever the hosts called; the leaders compare the texts and all reach the same
    verdict. Then each leader broadcasts the verdict inside its host over "shm" (a HEADER of
    the error text, empty when they agree), and every rank raises InvalidArgument on
    disagreement. Inside a host, the host's "shm" part finds disagreement itself (it checks
    its members' calls before it moves data), or, for the operations that go over gloo among
    all ranks, the leader compares its members' call texts (gathered over "shm").

    Small payloads (at most SMALL bytes: all_reduce's host partial, broadcast's data) travel in
    the frame itself, so the check costs no extra round trip between hosts; a rank whose
    tensor the host step changed restores it on disagreement (a copy of at most SMALL bytes).
    Larger ones are checked first (check_all: the calls gathered inside the host, then the
    frame without payload), then moved as before."""

    TEXT = 512  # bytes of a frame's call text
    SMALL = 4096  # payload bytes that travel in the frame
    HEADER = 1024  # bytes of the verdict broadcast inside a host

    def __init__(self, group):
        # A proxy: the group holds this helper, and a cycle would keep the group (its gloo
        # groups and their threads) alive past destroy_process_group, to the interpreter's end.
        self.g = weakref.proxy(group)
        self._texts = {}  # (text, bytes) -> its encoded uint8 tensor (calls repeat)
        self.abandoned = None  # the Work of the last frame posted without waiting
        self._frame = self._frames = None  # exchange's buffers (allocated once)
        self._headers = {}  # payload bytes -> release's buffer

    # -- describing calls

    def call(self, what, tensor=None, op=None, root=None, count=None):
        """The text of a call, as lib/coll/fingerprint.cpp says it: root as a global rank."""
        parts = []
        if op is not None:
            parts.append("op=" + _OP_NAMES.get(_kind(op), str(_kind(op))))
        if root is not None:  # gloo refuses a root outside the group; said as given here
            r = root[1]
            parts.append(root[0] + "=" + str(self.g.global_ranks[r] if 0 <= r < self.g.size()
                                               else r))
        if tensor is not None:
            parts.append(str(tensor.dtype))
            parts.append(str(tensor.numel() if count is None else count) + " elements")
        return what + "(" + ", ".join(parts) + ")"

    def _encode(self, text, size):
        t = self._texts.get((text, size))
        if t is None:
            data = text.encode()[:size]
            t = torch.zeros(size, dtype=torch.uint8)
            if data:
                t[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            if len(self._texts) > 256:
                self._texts.clear()
            self._texts[(text, size)] = t
        return t

    @staticmethod
    def _decode(frame):
        return bytes(frame.tolist()).rstrip(b"\0").decode(errors="replace")

    def small(self, tensor):
        return tensor.numel() * tensor.element_size() <= self.SMALL

    def _leader_of(self, h):
        r = self.g.hosts[h][0]
        return "group rank " + str(r) + " (global rank " + str(self.g.global_ranks[r]) + ")"

    # -- the leaders' exchange

    def exchange(self, call, payload=None):
        """On a leader: the frames of every host's leader, in host order, after this leader's
        (its call, and `payload` if it fits) went to all; and the verdict: None when all called
        the same, else the InvalidArgument text every leader computes alike."""
        if self._frame is None:  # this group's frames, reused: each call waits for its own
            self._frame = torch.zeros(self.TEXT + self.SMALL, dtype=torch.uint8)
            self._frames = [torch.empty_like(self._frame) for _ in self.g.hosts]
        work, frames = self._post(call, payload, self._frame, self._frames)
        work.wait()
        return self._verdict(frames), frames

    def _post(self, call, payload=None, frame=None, frames=None):
        if frame is None:
            frame = torch.zeros(self.TEXT + self.SMALL, dtype=torch.uint8)
            frames = [torch.empty_like(frame) for _ in self.g.hosts]
        frame[:self.TEXT] = self._encode(call, self.TEXT)
        if payload is not None and self.small(payload):
            nbytes = payload.numel() * payload.element_size()
            flat = payload.resolve_conj().resolve_neg().contiguous().reshape(-1)
            frame[self.TEXT:self.TEXT + nbytes] = flat.view(torch.uint8)
        return self.g.leaders.allgather([frames], [frame]), frames

    def _verdict(self, frames):
        texts = [f[:self.TEXT] for f in frames]
        if int(texts[0][0]) != ord("!") and all(torch.equal(t, texts[0]) for t in texts[1:]):
            return None
        calls = [self._decode(t) for t in texts]
        for h, c in enumerate(calls):
            if c.startswith("!"):
                return c[1:]
        h = next(h for h in range(1, len(calls)) if calls[h] != calls[0])
        return ("shm backend: a collective across hosts: the members' calls disagree: " +
                self._leader_of(h) + " called " + calls[h] + " but " + self._leader_of(0) +
                " called " + calls[0] + ". Every member must call the same collectives in "
                "the same order, with the same op, dtype, element counts and root; this call "
                "did nothing on any member")

    def payload(self, frame, like):
        """The payload of a frame, as a tensor of `like`'s dtype and shape (a view)."""
        nbytes = like.numel() * like.element_size()
        return frame[self.TEXT:self.TEXT + nbytes].view(like.dtype).view(like.shape)

    # -- inside each host

    def in_host(self, step):
        """Runs `step` (this host's "shm" part of the call, which checks that the host's ranks
        agree). When it raises InvalidArgument on a leader, the other hosts' leaders, waiting
        in the exchange, get the text (so that their ranks raise too) before it is raised."""
        try:
            step()
        except _C.InvalidArgument as e:
            if self.g.leaders is not None:
                # Posted, not waited for: this rank raises at once, as its host mates do, and
                # the other leaders' frames of this call meet it whenever they come (gloo's
                # worker sends it; the Work keeps the tensors).
                text = self.g._named_globally(str(e))
                self.abandoned = self._post(
                    "!" + text.encode()[:self.TEXT - 1].decode(errors="ignore"))[0]
            raise

    def release(self, error, tensor=None):
        """Every rank of this host: the leader's verdict (`error`, None when the hosts agree)
        broadcast inside the host, followed by `tensor`'s bytes (a small payload the leader
        holds, copied into `tensor` on the others); raises InvalidArgument on disagreement."""
        g = self.g
        nbytes = 0 if tensor is None else tensor.numel() * tensor.element_size()
        if len(g.hosts[g._host]) > 1:
            frame = self._headers.get(nbytes)
            if frame is None:
                if len(self._headers) > 64:
                    self._headers.clear()
                frame = self._headers[nbytes] = torch.empty(self.HEADER + nbytes,
                                                            dtype=torch.uint8)
            if g.leaders is not None:
                frame[:self.HEADER] = self._encode(error or "", self.HEADER)
                if nbytes and error is None:
                    frame[self.HEADER:] = tensor.resolve_conj().resolve_neg().contiguous().reshape(
                        -1).view(torch.uint8)
            g.local.broadcast([frame], _broadcast_opts(0)).wait()
            if g.leaders is None:
                if int(frame[0]) != 0:
                    error = self._decode(frame[:self.HEADER])
                elif nbytes:
                    tensor.copy_(frame[self.HEADER:].view(tensor.dtype).view(tensor.shape))
        if error is not None:
            raise _disagree(error)

    def check(self, call):
        """The check without payload, for a call whose data moves after it: the leaders'
        exchange, then the verdict inside each host."""
        error = self.exchange(call)[0] if self.g.leaders is not None else None
        self.release(error)

    def check_all(self, call):
        """The check of an operation that goes over gloo among all ranks: the host's calls
        gathered to its leader over "shm" (a frame of fixed size each) and compared there,
        then as check()."""
        g = self.g
        host = g.hosts[g._host]
        text = self._encode(call, self.TEXT)
        error = None
        if len(host) > 1:
            calls = [torch.empty_like(text) for _ in host]
            # in_host: when the host's "shm" part finds its members in different collectives,
            # the other hosts' leaders (waiting in the exchange) are told too (review 6).
            self.in_host(lambda: g.local.allgather([calls], [text]).wait())
            bad = next((i for i in range(1, len(host)) if not torch.equal(calls[i], calls[0])),
                       None)
            if bad is not None:
                def who(i):
                    return "group rank " + str(host[i]) + " (global rank " + \
                        str(g.global_ranks[host[i]]) + ")"
                error = ("shm backend: a collective across hosts: the members' calls "
                         "disagree: " + who(bad) + " called " + self._decode(calls[bad]) +
                         " but " + who(0) + " called " + self._decode(calls[0]) + ". Every "
                         "member must call the same collectives in the same order, with the "
                         "same op, dtype, element counts and root; this call did nothing on "
                         "any member")
        if g.leaders is not None:
            theirs = self.exchange(call if error is None else
                                   "!" + error.encode()[:self.TEXT - 1].decode(errors="ignore"))[0]
            error = error or theirs
        self.release(error)

    def check_splits(self, what, sends, recvs):
        """all_to_all's pieces, after check_all agreed on the call: every rank's elements to
        and from each group rank (2 x size counts, the same size on every rank) go to all
        ranks over gloo, and every rank finds the same first pair that disagrees."""
        g = self.g
        n = g.size()
        mine = torch.tensor(list(sends) + list(recvs), dtype=torch.int64)
        rows = [torch.empty_like(mine) for _ in range(n)]
        g.gloo.allgather([rows], [mine]).wait()
        counts = [row.tolist() for row in rows]

        def who(r):
            return "group rank " + str(r) + " (global rank " + str(g.global_ranks[r]) + ")"
        for i in range(n):
            for j in range(n):
                if counts[i][j] != counts[j][n + i]:
                    raise _disagree(
                        "shm backend: " + what + " across hosts: the members' splits "
                        "disagree: " + who(i) + " sends " + str(counts[i][j]) + " elements to " +
                        who(j) + ", which expects " + str(counts[j][n + i]) + " from it. Every "
                        "member must call the same collectives in the same order, with "
                        "matching splits; this call did nothing on any member")


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

    def __init__(self, store, prefix, rank=None):
        self.store = store
        self.rank = rank  # this process's global rank (named in a timeout's text)
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
            if _timed_out(error):
                # No rank had died when this call's wait expired (a death is recorded within
                # a second of it, far less than a group's timeout): a death recorded later,
                # such as a peer leaving without finalizing after its own timeout, did not
                # cause it. The timeout is the cause.
                return self.timeout(error, what)
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

    def timeout(self, error, what):
        if isinstance(error, _C.Timeout):
            return error
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        return _C.Timeout(
            "shm backend: " + what + " across hosts on global rank " + str(self.rank) +
            " timed out, and no rank had died by then (gloo: " + first + "); check that every "
            "rank makes the matching call, or give the group a longer timeout")

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


def _timed_out(error):
    """Whether a call failed because its wait expired ("shm"'s Timeout, gloo's "Timed out
    waiting 6000ms for recv operation to complete")."""
    return isinstance(error, _C.Timeout) or "timed out" in str(error).lower()


def _watched(what):
    """Makes a failing call raise PeerFailure naming a rank that died anywhere (_Deaths)."""
    def wrap(method):
        @functools.wraps(method)
        def call(self, *args, **kwargs):
            try:
                return method(self, *args, **kwargs)
            except _C.InvalidArgument as e:
                if getattr(e, "named_globally", False):
                    raise
                renamed = self._named_globally(str(e))
                if renamed == str(e):
                    raise
                raise type(e)(renamed) from None  # the host's indices would only mislead
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


class _Claim:
    """One receive through a _Mailbox: from group rank `src`, or any source (None)."""

    __slots__ = ("src", "tensor", "done", "source", "error")

    def __init__(self, src, tensor):
        self.src, self.tensor = src, tensor
        self.done, self.source, self.error = False, -1, None


# A message across hosts is a gloo message of fixed size, the header (the payload's element
# count and dtype, and the payload itself if it has at most _INLINE bytes), on the user's
# tag, then for a larger payload the payload on the tag + _PAYLOAD_TAG. gloo sizes a receive
# when it is posted and aborts the process (its enforce, SIGABRT) when a message of another
# size arrives in it, and a receive from any source cannot know the size of the message it
# will get; a header receive always fits, and the payload's receive, posted from the header's
# source once the header came, is sized by the header. The payload has a tag of its own so
# that no header receive (from any source) can take a payload. A small message is one gloo
# message, as before the header existed.
_PAYLOAD_TAG = 1 << 30
_HEADER_WORDS = 16  # int64s: count, dtype, then up to _INLINE bytes of payload
_INLINE = (_HEADER_WORDS - 2) * 8
_DTYPES = [getattr(torch, n) for n in (
    "float32", "float64", "float16", "bfloat16", "uint8", "int8", "int16", "int32", "int64",
    "bool", "complex64", "complex128")]
_DTYPE_CODE = {d: i for i, d in enumerate(_DTYPES)}


def _remote_tag(tag, what, rank):
    if not 0 <= tag < _PAYLOAD_TAG:
        raise _C.InvalidArgument(
            "shm backend: " + what + " across hosts on global rank " + str(rank) + " with tag "
            + str(tag) + ": tags across hosts must be in [0, 2**30) (a message across hosts "
            "is a header on its tag and the payload on the tag + 2**30); use a smaller tag")
    return tag + _PAYLOAD_TAG


def _header(tensor, what, rank):
    code = _DTYPE_CODE.get(tensor.dtype)
    if code is None:
        raise _C.InvalidArgument(
            "shm backend: " + what + " across hosts on global rank " + str(rank) + " of dtype "
            + str(tensor.dtype) + ": only " + ", ".join(str(d) for d in _DTYPES) + " go "
            "across hosts; convert the tensor to one of them")
    raw = bytearray(_HEADER_WORDS * 8)  # built in Python: a third of torch ops' cost
    struct.pack_into("<qq", raw, 0, tensor.numel(), code)
    header = torch.frombuffer(raw, dtype=torch.int64)  # keeps `raw` alive
    nbytes = tensor.numel() * tensor.element_size()
    if 0 < nbytes <= _INLINE:
        header.view(torch.uint8)[16:16 + nbytes].copy_(
            tensor.detach().resolve_conj().resolve_neg().reshape(-1).view(torch.uint8))
    return header, nbytes


class _Payloads:
    """The payload sends of a group across hosts, kept alive and waited for by one thread.
    gloo's send completes only once the receiver posted its receive, and the receiver posts a
    payload's receive only once it saw the header, in a later look at its mailbox (a wait): a
    send whose Work waited for its payload would deadlock two ranks that each wait for their
    send before their receive (isend, irecv, wait in that order, as batch_isend_irecv does).
    So a send's Work is its header's, and the payload goes from a copy of the tensor (the
    caller may reuse it once the Work completed), whose gloo Work this thread keeps until it
    completes (gloo's Work completes only in wait, and must live until then). A payload that
    fails (its receiver died) fails the receive on the other side, which reports it."""

    def __init__(self):
        self.queue = queue.SimpleQueue()  # thread-safe hand-over to the thread
        self.thread = None

    def add(self, work):
        self.queue.put(work)
        if self.thread is None:
            self.thread = threading.Thread(target=self._drain, args=(self.queue,), daemon=True,
                                           name="shmdist-hosts-send")
            self.thread.start()

    @staticmethod
    def _drain(works):
        while True:
            work = works.get()
            try:
                work.wait(_Posted._FOREVER)
            except Exception:  # noqa: BLE001,S110 - the receiving side reports the failure
                pass


class _Posted:
    """A receive the mailbox posted on one transport, into a buffer of its own. gloo's Work
    completes only in wait() (its is_completed stays False until then): either the receiver
    waits in it (_Mailbox.wait, while nothing else needs looking at) or a thread does, from
    when the mailbox must also poll "shm" or enforce an any-source claim's timeout itself;
    "shm"'s is polled. A gloo receive is a header's (`header`: of fixed size, from any source
    or a named one) or, once that came, its payload's (from the header's source)."""

    def __init__(self, work, buffer, remote, to_group, claim, header=False):
        self.work, self.buffer, self.remote, self.to_group = work, buffer, remote, to_group
        self.claim = claim  # the claim it was posted for (another may take its message)
        self.header = header
        self.arrived = threading.Event()
        self.error = None
        self.thread = None

    # gloo's wait() ends at the group's timeout, and then gloo breaks the whole context
    # (tcp's waitRecv calls signalException: every later gloo call of this rank fails with
    # "Connection closed"). A receive the mailbox left posted (for an any-source claim the
    # other transport served) may rightly wait longer than that for a later claim, whose own
    # wait enforces the group's timeout (_Mailbox.wait); so this thread waits without one.
    _FOREVER = timedelta(days=3650)

    def watch(self):
        """Has a thread wait for the gloo receive (once)."""
        if self.remote and self.thread is None and not self.arrived.is_set():
            self.thread = threading.Thread(target=self.wait_here, args=(self._FOREVER,),
                                           daemon=True, name="shmdist-hosts-recv")
            self.thread.start()

    def wait_here(self, timeout):
        """Waits in gloo's wait (a timeout of None: gloo's, the group's). The buffer (written
        by gloo before its wait returns) and `error` are written before `arrived` is set and
        read only after it is seen set: the Event's lock orders them for the reader."""
        try:
            if timeout is None:
                self.work.wait()
            else:
                self.work.wait(timeout)
        except Exception as e:  # noqa: BLE001 - handed to the receive that looks
            self.error = e
        self.arrived.set()

    def ready(self):
        if self.remote:
            return self.arrived.is_set()
        return self.work.is_completed()

    def source(self):
        """The sender's group rank (raises the receive's error)."""
        if self.error is not None:
            raise self.error
        if not self.remote:
            self.work.wait()  # completed: raises a failure
        rank = (getattr(self.work, "_source_rank", None) or self.work.source_rank)()
        return self.to_group(rank)


class _Mailbox:
    """The receives of one tag of a ProcessGroupHosts while a receive from any source, or from
    a rank of another host, is among them (docs/hosts.md, "Receiving from any source across
    hosts").

    This rank's messages come over two transports: "shm" from its host's ranks, gloo from the
    other hosts'. Neither can take back a receive once posted, so the mailbox posts at most one
    receive of this tag on each transport at a time, into a buffer of its own. On "shm", for
    the oldest unresolved claim that transport can serve (a claim from any source: from any
    rank of that transport; a claim from a named rank: from it, if it is on that transport).
    On gloo, a header receive (fixed size, so any message's header fits it): from the named
    rank if every unresolved claim gloo can serve names that one rank, else from any rank; once
    a header came, the receive of its payload, from its source, sized by it, and only then the
    next header receive. Each message that completes is appended to `arrived`, in the order
    the mailbox sees them complete (it looks at the two transports alternately, so neither
    starves). Then every arrived message, oldest first, goes to the oldest unresolved claim
    that matches it (its source, or any), as MPI matches a message to the first posted
    receive that matches it; a message whose size or dtype differs from that claim's fails
    the claim (InvalidArgument naming both) and stays for a later receive, as on one host. A
    message no claim matches yet stays in `arrived` for a later receive of this tag, which
    takes it before anything newer: no message is lost or taken twice, and the messages of one
    source are taken in the order it sent them (each source is on one transport, whose
    receives the mailbox posts one at a time). While the mailbox has anything posted, arrived
    or claimed, every receive of its tag from another host, and every receive of its tag from
    this host while it involves this host's transport (involves_local), goes through it; when
    it has nothing, it is dropped."""

    # How long a wait sleeps between looks at "shm" (a gloo arrival wakes it at once).
    POLL = 0.0002

    def __init__(self, group, tag):
        self.group, self.tag = group, tag
        self.claims = []  # unresolved _Claims, in the order posted
        self.arrived = []  # [(group rank, tensor)] not yet taken, in the order seen
        self.posted = {False: None, True: None}  # remote? -> _Posted or None
        self.first = False  # the transport looked at first next time (alternates)

    def claim(self, src, tensor):
        c = _Claim(src, tensor)
        self.claims.append(c)
        self._step()
        return _ClaimWork(self, c)

    def _remote(self, r):
        return self.group._host_of[r] != self.group._host

    def _serves(self, remote, c):
        return c.src is None or self._remote(c.src) == remote

    def involves_local(self):
        """Whether a receive from a rank of this host must go through the mailbox (to keep
        its order with what the mailbox holds or posted on "shm")."""
        return (self.posted[False] is not None
                or any(c.src is None or not self._remote(c.src) for c in self.claims)
                or any(not self._remote(src) for src, _ in self.arrived))

    def _post(self):
        g = self.group
        if self.posted[False] is None and len(g.hosts[g._host]) > 1:
            c = next((c for c in self.claims if self._serves(False, c)), None)
            if c is not None:
                buffer = torch.empty_like(c.tensor)
                host = g.hosts[g._host]
                work = (g.local.recv_anysource([buffer], self.tag) if c.src is None else
                        g.local.recv([buffer], g._local_rank[c.src], self.tag))
                self.posted[False] = _Posted(work, buffer, False, lambda r: host[r], c)
        if self.posted[True] is None:
            sources = {c.src for c in self.claims if self._serves(True, c)}
            if sources:
                header = torch.empty(_HEADER_WORDS, dtype=torch.int64)
                work = (g.gloo.recv([header], sources.pop(), self.tag)
                        if len(sources) == 1 and None not in sources else
                        g.gloo.recv_anysource([header], self.tag))
                self.posted[True] = _Posted(work, header, True, lambda r: r, None, header=True)

    def _payload(self, src, header):
        """Posts the receive of the payload whose header came from group rank `src` (or, for
        a payload the header holds, appends the message at once)."""
        g = self.group
        n, code = header[:2].tolist()
        if n < 0 or not 0 <= code < len(_DTYPES):
            raise _C.InvalidArgument(
                "shm backend: a message across hosts from global rank " +
                str(g.global_ranks[src]) + " to global rank " + str(g.global_ranks[g.rank()]) +
                " (tag " + str(self.tag) + ") has a corrupt header " + str([n, code]) +
                "; check that every rank runs the same shmdist")
        buffer = torch.empty(n, dtype=_DTYPES[code])
        nbytes = n * buffer.element_size()
        if nbytes <= _INLINE:
            if nbytes:
                buffer.view(torch.uint8).copy_(header.view(torch.uint8)[16:16 + nbytes])
            self.arrived.append((src, buffer))
            return
        work = g.gloo.recv([buffer], src, self.tag + _PAYLOAD_TAG)
        self.posted[True] = _Posted(work, buffer, True, lambda r: r, None)

    def _step(self):
        """Collects what completed, hands arrived messages to claims, posts what the oldest
        unresolved claims need. Raises the error of a posted receive that failed."""
        order = (self.first, not self.first)
        self.first = not self.first
        for remote in order:
            p = self.posted[remote]
            if p is not None and p.ready():
                self.posted[remote] = None
                try:
                    src = p.source()
                except _C.InvalidArgument as e:
                    # "shm" refused the message for the buffer's size (or dtype) and left it
                    # queued. If the claim the receive was posted for is still the oldest it
                    # can serve, the message is that claim's, and so is the error (as a recv
                    # on one host); else that claim was served over gloo meanwhile, and the
                    # receive is posted again, below, sized for the claim now oldest.
                    if remote:
                        raise
                    if p.claim in self.claims:
                        self.claims.remove(p.claim)
                        p.claim.error, p.claim.done = e, True
                    continue
                if p.header:
                    self._payload(src, p.buffer)
                else:
                    self.arrived.append((src, p.buffer))
        g = self.group
        kept = []
        for src, buffer in self.arrived:
            c = next((c for c in self.claims if c.src is None or c.src == src), None)
            if c is None:
                kept.append((src, buffer))
                continue
            self.claims.remove(c)
            c.source = src
            c.done = True
            if c.tensor.numel() != buffer.numel() or c.tensor.dtype != buffer.dtype:
                # As on one host: the receive fails, the message stays for a later one.
                c.error = _C.InvalidArgument(
                    "shm backend: recv of " + str(c.tensor.numel()) + " elements of " +
                    str(c.tensor.dtype) + " on global rank " + str(g.global_ranks[g.rank()]) +
                    " got a message of " + str(buffer.numel()) + " elements of " +
                    str(buffer.dtype) + " from global rank " + str(g.global_ranks[src]) +
                    " (tag " + str(self.tag) + "); the message stays queued for a receive "
                    "of its size and dtype: post one, or check what the sender sends")
                kept.append((src, buffer))
                continue
            try:
                c.tensor.copy_(buffer.view(c.tensor.shape))
            except Exception as e:  # noqa: BLE001 - raised by this claim's wait
                c.error = e
        self.arrived = kept
        self._post()
        if not (self.claims or self.arrived or any(self.posted.values())) and \
                g._mailboxes.get(self.tag) is self:
            del g._mailboxes[self.tag]

    def wait(self, c, timeout=None):
        limit = timeout if timeout is not None else self.group.timeout
        deadline = None if limit is None else time.monotonic() + limit.total_seconds()
        while not c.done:
            self._step()
            if c.done:
                break
            now = time.monotonic()
            if deadline is not None and now > deadline:
                g = self.group
                raise _C.Timeout(
                    "shm backend: recv " + ("from any source" if c.src is None else "from rank "
                    + str(g.global_ranks[c.src])) + " with tag " + str(self.tag) + " on rank " +
                    str(g.global_ranks[g.rank()]) + " timed out after " + str(limit) +
                    "; check that a rank sends it")
            remote = self.posted[True]
            if remote is None:
                time.sleep(self.POLL)
            elif (remote.thread is None and self.posted[False] is None
                  and all(c.src is not None for c in self.claims)):
                # Nothing to poll on "shm" and no claim from any source: wait in gloo's own
                # wait, as a recv from a named rank of another host does (gloo's timeout,
                # which as there breaks this rank's gloo context when it expires).
                remote.wait_here(None if deadline is None else
                                 timedelta(seconds=max(deadline - now, 0.001)))
            else:
                remote.watch()
                remote.arrived.wait(self.POLL)  # woken at once by a message from another host
        if c.error is not None:
            raise c.error


class _ClaimWork(_Work):
    """The Work of a receive through a _Mailbox."""

    def __init__(self, box, claim):
        super().__init__()
        self.box, self.claim = box, claim

    def wait(self, timeout=None):
        try:
            self.box.wait(self.claim, timeout)
        except (_C.InvalidArgument, _C.Timeout):
            raise
        except RuntimeError as e:
            if self.box.group.deaths is None:
                raise
            raise self.box.group.deaths.failure(e, "recv") from e
        return True

    def is_completed(self):
        if not self.claim.done:
            self.box._step()
        return self.claim.done

    def is_success(self):
        return self.claim.done and self.claim.error is None

    def exception(self):
        return self.claim.error

    def _source_rank(self):
        return self.claim.source

    def source_rank(self):
        return self.claim.source

    def result(self):
        return [self.claim.tensor]


class _AllWork(_Work):
    """The Work of _end_coalescing: done when every Work posted while coalescing is; wait
    waits for them in the order they were posted and raises the first failure."""

    def __init__(self, works):
        super().__init__()
        self.works = works

    def wait(self, timeout=None):
        for work in self.works:
            if timeout is None:
                work.wait()
            else:
                work.wait(timeout)
        return True

    def is_completed(self):
        return all(work.is_completed() for work in self.works)

    def is_success(self):
        return all(work.is_success() for work in self.works)

    def result(self):
        return []


class _Call:
    """One collective posted to an _InOrder: its communication (`run`, which raises what the
    caller's wait() is to raise), the tensors its Work returns, and its outcome."""

    __slots__ = ("run", "result", "done", "error", "future")

    def __init__(self, run, result):
        self.run, self.result = run, result
        self.done, self.error, self.future = False, None, None


class _InOrder:
    """Runs the collectives of one ProcessGroupHosts one at a time, in the order this rank
    called them, which is the order every member calls them (collectives are matched by their
    order, as on every backend), so every rank runs the same sequence on the group's "shm"
    part and its leaders' gloo group.

    A posted call runs on the group's thread (started on the first post, it ends after IDLE
    seconds without work), so the caller goes on while it runs: DDP posts each bucket's
    all-reduce from the backward pass and waits for them all at its end, as with gloo, whose
    collectives run on gloo's own threads. A thread that waits for a call nobody has started
    yet runs it itself (and the calls posted before it, in order) instead of handing it over
    (dist.all_reduce(async_op=True) followed at once by wait() pays no hand-over between
    threads). Waiting holds no lock and releases the GIL (threading's waits do, and so do the
    waits in the "shm" and gloo calls a collective makes)."""

    IDLE = 5.0  # s the group's thread waits for work before it ends

    # Every field here and every _Call's outcome (done, error, future) is read and written
    # under cond's lock, so a thread that sees a call done also sees its error and future;
    # only the thread that set busy pops and runs calls, so they run one at a time, in order.
    def __init__(self, name, who):
        self.who = who  # "global rank N", for errors
        self.cond = threading.Condition()
        self.queue = collections.deque()  # _Calls not started yet, in posting order
        self.busy = False  # a thread (the group's or a waiter) is running calls
        self.thread = None  # the group's thread, while it runs
        self.name = name

    def idle(self):
        """Nothing posted is pending: a call may run at once on the caller's thread."""
        with self.cond:
            return not self.queue and not self.busy

    def drain(self):
        """Returns once every call posted before it has run (running them here if nobody has
        started them), for an operation that runs on the caller's thread over the same groups
        (the check across hosts of an operation over gloo among all ranks). Their errors stay
        with their Works."""
        if not self.idle():
            marker = _Call(lambda: None, None)
            self.post(marker)
            self.wait(marker)

    def post(self, call):
        with self.cond:
            self.queue.append(call)
            if self.thread is None:
                self.thread = threading.Thread(target=self._serve, daemon=True, name=self.name)
                self.thread.start()
            else:
                self.cond.notify_all()

    def _serve(self):
        while True:
            with self.cond:
                deadline = time.monotonic() + self.IDLE
                while not self.queue or self.busy:
                    left = deadline - time.monotonic()
                    if not self.queue and left <= 0:
                        self.thread = None  # under the lock: a later post starts another
                        return
                    self.cond.wait(left if left > 0 else self.IDLE)
                self.busy = True
            self._run_queued(None)

    def _run_queued(self, until):
        """On the thread that set busy: runs the queued calls in order until `until` is done
        (None: until none is left), then lets another thread run them."""
        while True:
            with self.cond:
                if not self.queue or (until is not None and until.done):
                    self.busy = False
                    self.cond.notify_all()
                    return
                call = self.queue.popleft()
            error = None
            try:
                call.run()
            except BaseException as e:  # noqa: BLE001 - raised by the call's wait(); a
                error = e  # KeyboardInterrupt too, so that the runner role is given back
            with self.cond:
                call.done, call.error = True, error
                future = call.future
                self.cond.notify_all()
            if future is not None:
                # On a thread of its own: torch runs the future's callbacks inline, and a
                # callback may post a collective and wait for it (DDP's PowerSGD hook), which
                # needs this thread free to run it (review 6).
                threading.Thread(target=_complete, args=(future, call), daemon=True,
                                 name="shmdist-hosts-future").start()

    def wait(self, call, timeout=None):
        """Until `call` has run (running it here if nobody has started it); raises its error,
        or Timeout after `timeout` (a timedelta; None or 0, torch's kNoTimeout, for none)
        while another thread runs it."""
        limit = 0 if timeout is None else timeout.total_seconds()
        deadline = time.monotonic() + limit if limit > 0 else None
        with self.cond:
            while not call.done and (self.busy or not self.queue):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise _C.Timeout(
                        "shm backend: a collective across hosts on " + self.who + " did not "
                        "complete within the wait's timeout of " + str(timeout) + " (it is "
                        "still running, and the group's timeout ends it); wait longer, or "
                        "check that every rank of the group made the same collectives")
                self.cond.wait(left)
            claimed = not call.done
            if claimed:
                self.busy = True  # not started and nobody runs the queue: run it here
        if claimed:
            self._run_queued(call)
        if call.error is not None:
            raise call.error

    def future(self, call):
        """A torch Future completed with the call's result (or its error) once it has run."""
        with self.cond:
            made = call.future is None
            if made:
                call.future = torch.futures.Future()
            done, future = call.done, call.future
        if made and done:  # else _run_queued completes it (it reads call.future after done)
            _complete(future, call)
        return future


def _complete(future, call):
    if call.error is None:
        future.set_result(call.result)
    else:
        future.set_exception(call.error)


class _InOrderWork(_Work):
    """The Work of a collective posted to an _InOrder: wait() returns once it has run and
    raises its error unchanged (PeerFailure, Timeout, InvalidArgument); get_future() is what
    DDP waits on."""

    def __init__(self, order, call):
        super().__init__()
        self.order, self.call = order, call

    def wait(self, timeout=None):
        self.order.wait(self.call, timeout)
        return True

    def is_completed(self):
        return self.call.done

    def is_success(self):
        return self.call.done and self.call.error is None

    def exception(self):
        return self.call.error

    def result(self):
        return self.call.result

    def get_future(self):
        return self.order.future(self.call)


def _global_rank_text(text, global_ranks):
    """gloo's text naming group ranks ("Rank 1 failed ...", "Ranks 1, 2 failed ...", "[Rank
    0]: ...") with the group's global ranks instead."""
    def one(m):
        return str(global_ranks[int(m.group(0))]) if int(m.group(0)) < len(global_ranks) \
            else m.group(0)

    def ranks(m):
        return m.group(1) + re.sub(r"\d+", one, m.group(2))
    return re.sub(r"(\b[Rr]anks? )(\d+(?:, \d+)*)", ranks, text)


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
        self._coalesced = None  # the Works posted since _start_coalescing, while coalescing
        self._mailboxes = {}  # tag -> _Mailbox, while a receive of it from any source or
        # from another host is involved
        self._payloads = _Payloads()  # the payloads of sends to other hosts, in flight
        self.timeout = None  # the group's timeout (set by the creator), bounds any-source waits
        # The global rank of each rank of this host's "shm" job (which numbers them from 0):
        # this host's members, or for a sub-group whose "shm" part is a sub-group of the
        # world's, the world's members on this host (set by the creator).
        self._host_job_globals = [self.global_ranks[r] for r in hosts[self._host]]
        self._agree = _Agreement(self)  # the hosts agree on each collective first (issue 30)
        # The collectives over the "shm" part and the leaders' group, in the order called.
        self._order = _InOrder("shmdist-hosts-collectives",
                               "global rank " + str(self.global_ranks[rank]))

    def getBackendName(self):
        return "shm"

    def _named_globally(self, text):
        """A text of this host's "shm" part, which numbers its ranks from 0 (a collective whose
        members disagree names "group rank 1 (global rank 1)" and "src=1" for global rank 3),
        with this group's ranks and the global ranks instead."""
        names = self._host_job_globals

        def member(m):
            j = int(m.group(2))
            if not 0 <= j < len(names) or names[j] not in self.global_ranks:
                return m.group(0)
            g = names[j]
            return "group rank " + str(self.global_ranks.index(g)) + " (global rank " + \
                str(g) + ")"

        def root(m):
            j = int(m.group(2))
            return m.group(1) + "=" + (str(names[j]) if 0 <= j < len(names) else m.group(2))
        if "disagree" not in text and "rejected its arguments" not in text:
            return text
        text = re.sub(r"group rank (\d+) \(global rank (\d+)\)", member, text)
        text = re.sub(r"\b(root|src|dst)=(\d+)", root, text)
        return text.replace("on the world group)", "on this host's \"shm\" part of the group)")

    # torch 2's ProcessGroup keeps its name in its backends, and this group has none (it is
    # the backend): DeviceMesh, DTensor and the functional collectives find groups by name.
    def _set_group_name(self, name):
        self._group_name = name

    @property
    def group_name(self):
        if getattr(self, "_group_name", None) is None:
            raise RuntimeError("ProcessGroup name not set")
        return self._group_name

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
            # To another host: the header, then the payload unless the header holds it, both
            # over gloo (_PAYLOAD_TAG says why); the Work is the header's (_Payloads says why).
            tensor = self._one(tensors, "send")
            me = self.global_ranks[self.rank()]
            ptag = _remote_tag(tag, "send", me)
            header, nbytes = _header(tensor, "send", me)
            # The payload's copy is made before the header goes (gloo sends contiguous tensors
            # only): once the header is out, the receiver waits for the payload (review 6).
            payload = tensor.detach().resolve_conj().resolve_neg().clone(
                memory_format=torch.contiguous_format) if nbytes > _INLINE else None
            work = self.gloo.send([header], dst, tag)
            if payload is not None:
                self._payloads.add(self.gloo.send([payload], dst, ptag))
            return self._posted(work if self.deaths is None else
                                _WatchedWork(work, self.deaths, "send"))
        return self._posted(self.local.send(tensors, local, tag))

    @_watched("recv")
    def recv(self, tensors, src, tag=0):
        local = self._local_peer(src)
        box = self._mailboxes.get(tag)
        if local is None or (box is not None and box.involves_local()):
            # From another host (a header, then the payload it sizes), or in the order of
            # what the mailbox holds from this host's ranks: through the tag's mailbox.
            if local is None:
                _remote_tag(tag, "recv", self.global_ranks[self.rank()])
            return self._posted(self._mailbox(tag).claim(src, self._one(tensors, "recv")))
        return self._posted(self.local.recv(tensors, local, tag))

    @_watched("recv")
    def recv_anysource(self, tensors, tag=0):
        _remote_tag(tag, "recv", self.global_ranks[self.rank()])
        return self._posted(self._mailbox(tag).claim(None, self._one(tensors, "recv")))

    def _mailbox(self, tag):
        box = self._mailboxes.get(tag)
        if box is None:
            box = self._mailboxes[tag] = _Mailbox(self, tag)
        return box

    # collectives

    def _in_order(self, what, opts, body, result):
        """The Work of the collective `what` whose communication is body() (over the "shm" part
        and the leaders' group), returning `result`. It runs in the order of this group's
        collectives (_InOrder): posted when the caller may go on before it completes (torch 2
        says so in the options: asyncOp True, as DDP's calls have), and the Work completes
        once it has run; else at once on this thread (after anything posted before it), which
        costs no hand-over between threads. Errors reach wait() (or this call) as _watched
        makes them.

        torch 1.13's options do not say, and its C++ callers (DDP's reducer and parameter
        broadcast) wait on a Work through c10d's own Work::wait, which a Work written in
        Python cannot complete there (DDP hung): on torch 1.13 every collective completes
        before it returns, as before."""
        if not getattr(opts, "asyncOp", False) and self._order.idle():
            body()
            return _done(result)
        watched = _watched(what)(lambda group: body())
        call = _Call(lambda: watched(self), result)
        self._order.post(call)
        return _InOrderWork(self._order, call)

    @_watched("barrier")
    def barrier(self, opts=None):
        def body():
            # Nobody leaves before everyone entered: a leader passes the leaders' barrier only
            # once every leader has, each after its host's members entered; members leave
            # after it.
            self._agree.in_host(lambda: self.local.barrier().wait())
            self._agree.check("barrier()")  # the leaders' exchange, then the release in each host
        return self._in_order("barrier", opts, body, [])

    @_watched("monitored_barrier")
    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        # gloo's among all members: rank 0 waits for every member within the timeout and
        # raises naming the group ranks that did not arrive (all of them with wait_all_ranks).
        # Its text names group ranks; a sub-group's are given as global ranks here.
        try:
            if timeout is None:
                self.gloo.monitored_barrier(wait_all_ranks=wait_all_ranks)
            else:
                self.gloo.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)
        except RuntimeError as e:
            if self.global_ranks == list(range(self.size())):
                raise
            raise type(e)(_global_rank_text(str(e), self.global_ranks)) from e

    def _combine_hosts(self, tensor, op):
        """On a leader: the host partials gathered and combined in host order, into tensor."""
        # The choice depends only on what the leaders agreed on (op, dtype, hosts), never on a
        # leader's own tensor layout: leaders taking different gloo collectives would wait for
        # each other to the timeout (review 6). A layout gloo cannot take in place goes
        # through a contiguous copy.
        if len(self.hosts) == 2 and _kind(op) == _kind(dist.ReduceOp.SUM) and \
                tensor.dtype in _SUM_OVER_GLOO:
            if not tensor.is_contiguous() or tensor.is_conj() or tensor.is_neg():
                plain = tensor.resolve_conj().resolve_neg().contiguous()
                self.leaders.allreduce([plain]).wait()
                tensor.copy_(plain)
                return
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

    def _allreduce_small(self, tensor, op, avg, call):
        """_allreduce_one of at most _Agreement.SMALL bytes: the host partials travel with the
        check in one frame among the leaders, combined in host order (the same bits as
        _combine_hosts); on disagreement the leader's tensor gets its input back."""
        keep = tensor.clone() if self.leaders is not None else None
        self._agree.in_host(lambda: self.local.reduce([tensor], _reduce_opts(0, op)).wait())
        error = None
        if self.leaders is not None:
            error, frames = self._agree.exchange(call, tensor)
            if error is None:
                acc = self._agree.payload(frames[0], tensor)
                combine = _COMBINE[_kind(op)]
                for frame in frames[1:]:
                    acc = combine(acc, self._agree.payload(frame, tensor))
                tensor.copy_(acc)
                if avg:
                    tensor.div_(self.size())
            else:
                tensor.copy_(keep)
        self._agree.release(error, tensor)

    def _allreduce_one(self, tensor, op, call):
        # AVG: the SUM in the documented order, divided by the group's size on each leader
        # (in the tensor's dtype) before it broadcasts: every rank gets the same bits.
        avg = _kind(op) == _AVG
        if avg:
            op = dist.ReduceOp.SUM
        if self._agree.small(tensor):
            return self._allreduce_small(tensor, op, avg, call)
        self._agree.check_all(call)  # issue 30: before any message of the tensor's size
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
        call = self._agree.call("all_reduce", tensor, op)
        return self._in_order("all_reduce", opts, lambda: self._allreduce_one(tensor, op, call),
                              [tensor])

    @_watched("all_reduce_coalesced")
    def allreduce_coalesced(self, tensors, opts=None):
        op = self._check_op(opts if opts is not None else dist.AllreduceCoalescedOptions(),
                            "all_reduce_coalesced", tensors)

        def body():
            for tensor in tensors:
                self._allreduce_one(tensor, op, self._agree.call("all_reduce_coalesced", tensor,
                                                                 op))
        return self._in_order("all_reduce_coalesced", opts, body, list(tensors))

    @_watched("reduce")
    def reduce(self, tensors, opts=None):
        tensor = self._one(tensors, "reduce")
        op = self._check_op(opts, "reduce", [tensor])

        def body():
            result = tensor.clone()
            self._allreduce_one(result, op, self._agree.call("reduce", tensor, op,
                                                             ("dst", opts.rootRank)))
            if self.rank() == opts.rootRank:
                tensor.copy_(result)
        return self._in_order("reduce", opts, body, [tensor])

    @_watched("broadcast")
    def broadcast(self, tensors, opts=None):
        src = opts.rootRank if opts is not None else 0
        self._local_peer(src)
        src_host = self._host_of[src]
        call = self._agree.call("broadcast", self._one(tensors, "broadcast"), root=("src", src))

        def body():
            if self._agree.small(tensors[0]):
                self._broadcast_small(tensors[0], src, src_host, call)
                return
            self._agree.check_all(call)  # issue 30: before any message of the tensor's size
            # src's host first (its leader included), then the leaders, then the other hosts.
            if self._host == src_host:
                self.local.broadcast(tensors, _broadcast_opts(self._local_rank[src])).wait()
            if self.leaders is not None:
                self.leaders.broadcast(tensors, _broadcast_opts(src_host)).wait()
            if self._host != src_host:
                self.local.broadcast(tensors, _broadcast_opts(0)).wait()
        return self._in_order("broadcast", opts, body, list(tensors))

    def _broadcast_small(self, tensor, src, src_host, call):
        """broadcast of at most _Agreement.SMALL bytes: the data travels with the check in the
        leaders' frames; on disagreement the ranks of src's host get their input back."""
        keep = tensor.clone() if self._host == src_host and self.rank() != src else None
        if self._host == src_host:
            self._agree.in_host(lambda: self.local.broadcast(
                [tensor], _broadcast_opts(self._local_rank[src])).wait())
        error = None
        if self.leaders is not None:
            error, frames = self._agree.exchange(call, tensor if self._host == src_host
                                                 else None)
            if error is None and self._host != src_host:
                tensor.copy_(self._agree.payload(frames[src_host], tensor))
        try:
            self._agree.release(error, tensor if self._host != src_host else None)
        except _C.InvalidArgument:
            if keep is not None:
                tensor.copy_(keep)
            raise
        return _done([tensor])

    # Operations that only move data go over gloo among all members: exact, as "shm"'s.

    @_watched("all_gather")
    def allgather(self, output_tensors, input_tensors, opts=None):
        self._order.drain()  # the check meets the hosts over the collectives' groups
        self._agree.check_all(self._agree.call("all_gather", self._one(input_tensors,
                                                                     "all_gather")))
        return self.gloo.allgather(output_tensors, input_tensors)

    @_watched("all_gather_into_tensor")
    def _allgather_base(self, output, input, opts=None):
        outputs = list(output.chunk(self.size()))
        if not outputs or any(o.shape != input.shape for o in outputs):
            raise _C.InvalidArgument("shm backend: all_gather_into_tensor takes an output of "
                                     "world size x the input's size, got " +
                                     str(tuple(output.shape)) + " for an input of " +
                                     str(tuple(input.shape)))
        self._order.drain()  # the check meets the hosts over the collectives' groups
        self._agree.check_all(self._agree.call("all_gather_into_tensor", input))
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
        self._order.drain()  # the check meets the hosts over the collectives' groups
        self._agree.check_all(self._agree.call("gather", self._one(input_tensors, "gather"),
                                               root=("dst", opts.rootRank)))
        return self.gloo.gather(output_tensors, input_tensors, o)

    @_watched("scatter")
    def scatter(self, output_tensors, input_tensors, opts=None):
        o = dist.ScatterOptions()
        o.rootRank = opts.rootRank
        self._order.drain()  # the check meets the hosts over the collectives' groups
        self._agree.check_all(self._agree.call("scatter", self._one(output_tensors, "scatter"),
                                               root=("src", opts.rootRank)))
        return self.gloo.scatter(output_tensors, input_tensors, o)

    # all_to_all only moves data: over gloo among all members (its all_to_all_single; the
    # list form travels as one flat tensor of each rank's pieces).

    @_watched("all_to_all_single")
    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        self._check_all_to_all("all_to_all_single", output, input, output_split_sizes,
                               input_split_sizes)
        self.gloo.alltoall_base(output, input, list(output_split_sizes),
                                list(input_split_sizes), dist.AllToAllOptions()).wait()
        return _done([output])

    def _check_all_to_all(self, what, output, input, output_split_sizes, input_split_sizes):
        """Issue 30: the ranks agree on the call (dtype), then on every pair's piece."""
        n = self.size()
        self._order.drain()
        self._agree.check_all(self._agree.call(what, input, count=input.numel()) if not (
            output_split_sizes or input_split_sizes) else what + "(" + str(input.dtype) + ")")
        if output_split_sizes or input_split_sizes:  # else the count in the call says it
            self._agree.check_splits(what, list(input_split_sizes) or [input.numel() // n] * n,
                                     list(output_split_sizes) or [output.numel() // n] * n)

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
        self._check_all_to_all("all_to_all", flat_out, flat_in,
                               [t.numel() for t in output_tensors],
                               [t.numel() for t in input_tensors])
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
        """Checks the op; returns the communication (for _in_order), which reduces `flat`
        (every rank's pieces, rank order) and copies rank r's piece to pieces[r] on this rank
        (only this rank's entry is written)."""
        op = self._check_op(opts if opts is not None else dist.ReduceScatterOptions(), what,
                            [flat])

        def body():
            self._allreduce_one(flat, op, self._agree.call(what, flat, op))
            mine = pieces[self.rank()]
            offset = sum(p.numel() for p in pieces[:self.rank()])
            mine.copy_(flat[offset:offset + mine.numel()].view(mine.shape))
        return body

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
        return self._in_order("reduce_scatter", opts,
                              self._reduce_scatter_flat(pieces, flat, opts, "reduce_scatter"),
                              [output])

    @_watched("reduce_scatter_tensor")
    def _reduce_scatter_base(self, output, input, opts=None):
        return self._in_order("reduce_scatter_tensor", opts,
                              self._reduce_scatter_tensor_body(output, input, opts), [output])

    def _reduce_scatter_tensor_body(self, output, input, opts):
        """reduce_scatter_tensor's arguments checked; returns its communication."""
        if (input.numel() != output.numel() * self.size() or input.dtype != output.dtype):
            raise _C.InvalidArgument(
                "shm backend: reduce_scatter_tensor takes an input of world size (" +
                str(self.size()) + ") x the output's elements, of its dtype; got " +
                str(tuple(input.shape)) + " " + str(input.dtype) + " for an output of " +
                str(tuple(output.shape)) + " " + str(output.dtype))
        flat = input.reshape(-1).clone()
        pieces = [output] * self.size()
        return self._reduce_scatter_flat(pieces, flat, opts, "reduce_scatter_tensor")

    def reduce_scatter_single(self, output, input, opts=None):  # torch 2.13's name
        return self._reduce_scatter_base(output, input, opts)

    def allgather_coalesced(self, *args, **kwargs):
        _refuse("all_gather_coalesced")

    # torch 2.x's coalesced forms (its _coalescing_manager's "fast path", FSDP): one call of
    # the single-tensor form per tensor, in list order, each as above (same order, same bits).
    # Without these a call would reach torch's ProcessGroup, which has no backend here, and
    # say "No backend type associated with device type cpu".

    @_watched("reduce_scatter_tensor_coalesced")
    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        bodies = [self._reduce_scatter_tensor_body(output, input, opts)
                  for output, input in zip(outputs, inputs)]

        def body():
            for each in bodies:
                each()
        return self._in_order("reduce_scatter_tensor_coalesced", opts, body, list(outputs))

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        return self.reduce_scatter_single_coalesced(outputs, inputs, opts)

    @_watched("all_gather_into_tensor_coalesced")
    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        for output, input in zip(outputs, inputs):
            self._allgather_base(output, input, opts)
        return _done(list(outputs))

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return self.allgather_into_tensor_coalesced(outputs, inputs, opts)

    # torch 2.x's coalescing of point-to-point (batch_isend_irecv on a plain ProcessGroup,
    # _coalescing_manager with a device): every send and recv between the two calls is posted
    # as it comes (a send on this host over "shm", across hosts over gloo; none waits for its
    # receiver), and the Work of _end_coalescing waits for all of them, in the order they were
    # posted. Collectives in between run as they do outside (they complete before they return).

    def _start_coalescing(self, device=None):
        # A start while coalescing begins afresh, as NCCL's startCoalescing does: torch's
        # _coalescing_manager calls _end_coalescing only after a body that returned, so one
        # whose body raised leaves the group coalescing (its Works were returned to their
        # callers; nobody waits for the abandoned list).
        self._coalesced = []

    def _end_coalescing(self, device=None):
        if self._coalesced is None:
            raise _C.InvalidArgument("shm backend: _end_coalescing without _start_coalescing "
                                     "(global rank " + str(self.global_ranks[self.rank()]) +
                                     ")")
        works, self._coalesced = self._coalesced, None
        return _AllWork(works)

    def _posted(self, work):
        """A send's or recv's Work, remembered while coalescing."""
        if self._coalesced is not None:
            self._coalesced.append(work)
        return work


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
        group.deaths = _Deaths(store, prefix, group.global_ranks[rank])
        watcher = threading.Thread(target=group.deaths.watch, args=(_world,), daemon=True,
                                   name="shmdist-hosts-watch")
        watcher.start()
        # Stopped before the interpreter finalizes: a daemon thread that returns from a C++
        # call which released the GIL (_check_world_peers) while Python finalizes is ended by
        # pthread_exit inside that call, and the C++ runtime aborts the process ("terminate
        # called without an active exception") after the program ended well. The world can
        # outlive destroy_process_group (torch's DeviceMesh and DTensor keep groups).
        atexit.register(_stop_watching, group.deaths, watcher)
    return group


def _stop_watching(deaths, watcher):
    deaths.watching = False
    watcher.join(timeout=2 * _Deaths.POLL + 1.0)


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
    group = ProcessGroupHosts(rank, size, hosts, local, gloo, leaders, global_ranks)
    group.timeout = timeout
    return group


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
    group._host_job_globals = world._host_job_globals
    return group
