"""Point-to-point across hosts: a fixed-size header (count, dtype, small payloads inline) on
the user's tag, a larger payload on a tag of its own, and the per-tag mailbox that matches
receives (named and any-source) with what arrived, whichever host sent it.
"""

import queue
import struct
import threading
import time
from datetime import timedelta

import torch

from .. import _C
from .works import _OutcomeWork


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

    def stop(self, limit):
        """Waits (up to `limit` seconds) for the payloads in flight, which their receivers
        take (or fail, leaving), and ends the thread (in_order._InOrder.stop says why). A send
        whose Work completed has delivered its header: its payload goes before this rank exits,
        as a gloo send would have."""
        thread = self.thread
        if thread is None:
            return
        self.queue.put(None)
        thread.join(limit)
        if not thread.is_alive():
            self.thread = None

    @staticmethod
    def _drain(works):
        while True:
            work = works.get()
            if work is None:
                return  # stop(): every payload queued before it was waited for
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


class _ClaimWork(_OutcomeWork):
    """The Work of a receive through a _Mailbox."""

    def __init__(self, box, claim):
        super().__init__(claim)
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

    def _source_rank(self):
        return self.claim.source

    def source_rank(self):
        return self.claim.source

    def result(self):
        return [self.claim.tensor]
