"""The Work objects of the group across hosts that are not the collectives' own: a completed
one, the base of those whose outcome is a record's (a posted collective, a mailbox's
receive), a gloo send or receive whose failure is renamed (failures._Deaths), and the Work of
a coalesced batch.
"""

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

from .. import _C


def _done(result):
    """A completed Work returning `result` (the composite's collectives run to completion
    before they return)."""
    fut = torch.futures.Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


_Work = getattr(dist, "_Work", None) or torch._C._distributed_c10d.Work


class _OutcomeWork(_Work):
    """A Work whose outcome is a record's `done` and `error` (an _InOrder call, a mailbox
    claim), which is_completed, is_success and exception read."""

    def __init__(self, outcome):
        super().__init__()
        self.outcome = outcome

    def is_completed(self):
        return self.outcome.done

    def is_success(self):
        return self.outcome.done and self.outcome.error is None

    def exception(self):
        return self.outcome.error


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
