"""Failures across hosts: a rank that died anywhere is named by every survivor (_Deaths, the
job's record in the store, and its watcher), a failing call is renamed to say so (_watched),
and an operation the group does not have across hosts is refused (_refuse).
"""

import functools
import time


from .. import _C


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
