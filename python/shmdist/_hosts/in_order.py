"""Collectives posted asynchronously across hosts (torch 2's asyncOp, DDP's bucket
all-reduces) run on a thread of the group's own, one at a time, in posting order (_InOrder);
blocking calls run on the caller's thread when nothing is pending.
"""

import collections
import threading
import time

import torch

from .. import _C
from .works import _OutcomeWork


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
        self.stopping = False  # stop() asks the group's thread to end once nothing is queued
        self.completing = set()  # the threads completing futures (_run_queued), while they run

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
                    if not self.queue and (left <= 0 or self.stopping):
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
                thread = threading.Thread(target=self._complete, args=(future, call),
                                          daemon=True, name="shmdist-hosts-future")
                with self.cond:
                    self.completing.add(thread)
                thread.start()

    def _complete(self, future, call):
        try:
            _complete(future, call)
        finally:
            with self.cond:
                self.completing.discard(threading.current_thread())

    def stop(self, limit):
        """Has the group's thread run what is queued and end, and joins it and the threads
        completing futures (and a group's thread that their callbacks start again by posting
        a collective), within `limit` seconds in all (the group's timeout: a queued call ends
        by then). At exit and on destroy_process_group: a daemon thread that returns from
        a C++ call (a "shm" or gloo wait, a future's set_result), which released the GIL,
        while Python finalizes is ended by pthread_exit inside that call, and the C++ runtime
        aborts the process after the program ended well (issue 30: about 1 process in 6-10
        under torch 2.13)."""
        deadline = time.monotonic() + limit
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        try:
            # Until none is left: a future's callback may post a collective (DDP's PowerSGD
            # hook) once the group's thread has ended, which starts another. Not the thread
            # that stops (a callback that destroys the group).
            while time.monotonic() < deadline:
                with self.cond:
                    threads = [t for t in (self.thread, *self.completing)
                               if t is not None and t is not threading.current_thread()
                               and t.is_alive()]
                if not threads:
                    break
                for t in threads:
                    t.join(max(deadline - time.monotonic(), 0))
        finally:
            with self.cond:
                self.stopping = False  # a later post starts the group's thread again

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


class _InOrderWork(_OutcomeWork):
    """The Work of a collective posted to an _InOrder: wait() returns once it has run and
    raises its error unchanged (PeerFailure, Timeout, InvalidArgument); get_future() is what
    DDP waits on."""

    def __init__(self, order, call):
        super().__init__(call)
        self.order, self.call = order, call

    def wait(self, timeout=None):
        self.order.wait(self.call, timeout)
        return True

    def result(self):
        return self.call.result

    def get_future(self):
        return self.order.future(self.call)
