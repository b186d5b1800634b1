"""Registers shmdist as the torch.distributed backend "shm".

    import torch.distributed as dist
    import shmdist.torch                        # the first of the two lines that change
    dist.init_process_group(backend="shm")      # the second

Works with every init method (env://, tcp://, file://), under torchrun and under shmrun
(which sets MASTER_ADDR and MASTER_PORT), on one host or several (docs/hosts.md: "shm"
inside each host, gloo between hosts). Sub-groups made by dist.new_group share the
world's shared segment. torch 1.13 has no dist.ANY_SOURCE (any-source is src=None): this
module defines torch.distributed.ANY_SOURCE = None when torch lacks it, and lets
dist.monitored_barrier (which torch 1.13 refuses in Python for every backend but gloo)
through to "shm" groups.
"""

import time as _time
from datetime import timedelta as _timedelta

import torch
import torch.distributed as _dist

from ._build_info import TORCH_BUILT_AGAINST as _TORCH_BUILT_AGAINST


# The extension is compiled against one torch's C++ API (c10d::ProcessGroup on 1.13,
# c10d::Backend on 2.x), whose symbols change between releases: loading it into another torch
# fails with an undefined symbol, or worse, misbehaves. So the torch it was built against is
# compared before the extension is loaded, and another release is refused with what to do.
# A release is the public version, without the local label: 2.13.0+cpu is torch 2.13.0, the
# release a wheel of shmdist pins in its requirements (setup.py).
def _public(version):
    return version.split("+")[0]


def _release(version):
    return tuple(int(p) for p in _public(version).split(".")[:2])


if _public(torch.__version__) != _public(_TORCH_BUILT_AGAINST):
    raise ImportError(
        "shmdist.torch: this shmdist was built against torch " + _TORCH_BUILT_AGAINST +
        " but this interpreter (" + __import__("sys").executable + ") runs torch " +
        torch.__version__ + "; install torch==" + _public(_TORCH_BUILT_AGAINST) + " here, "
        "or a shmdist built for torch " + _public(torch.__version__) + " (pip install "
        "--force-reinstall --no-build-isolation <shmdist source tree> builds one against the "
        "torch of this environment)")

from . import _C  # noqa: E402  (only once the torch is known to be the right one)
from . import _hosts  # noqa: E402

_TORCH2 = _release(torch.__version__) >= (2, 0)

BACKEND = "shm"


def _create_process_group(options, pg_options):
    if pg_options is not None:
        raise _C.InvalidArgument("the shm backend takes no pg_options, got " + repr(pg_options)
                                 + "; leave pg_options unset (None)")
    # Members on several hosts (each its own /dev/shm): "shm" inside each host, gloo between
    # them (docs/hosts.md). On one host: the group as before.
    across_hosts = _hosts.create(options.store, options.group_rank, options.group_size,
                                 options.timeout, options.group_id,
                                 list(options.global_ranks_in_group))
    if across_hosts is not None:
        return across_hosts
    return _C._create_process_group(
        options.store,
        options.group_rank,
        options.group_size,
        options.timeout,
        options.group_id,
        list(options.global_ranks_in_group),
    )


if BACKEND.upper() not in _dist.Backend._plugins:
    if _TORCH2:
        # torch 2.x: a c10d.Backend for CPU tensors, which torch wraps in a ProcessGroup.
        _dist.Backend.register_backend(BACKEND, _create_process_group, extended_api=True,
                                       devices=["cpu"])
    else:
        _dist.Backend.register_backend(BACKEND, _create_process_group, extended_api=True)

if not hasattr(_dist, "ANY_SOURCE"):
    _dist.ANY_SOURCE = None


def _allow_monitored_barrier_on_shm():
    """torch 1.13's dist.monitored_barrier refuses every backend but gloo in Python, before
    reaching the backend; "shm" implements it, so let its groups through."""
    from torch.distributed import distributed_c10d as c10d
    original = c10d.monitored_barrier
    if getattr(original, "_shmdist", False):
        return

    def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
        if c10d._rank_not_in_group(group) or c10d.get_backend(group) != BACKEND:
            return original(group, timeout, wait_all_ranks)
        group_to_use = c10d._get_default_group() if group is None else group
        if timeout is None:  # as torch's: timedelta(0) is a timeout of 0, not "unset"
            timeout = c10d.default_pg_timeout
        return group_to_use.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)

    monitored_barrier._shmdist = True
    monitored_barrier.__doc__ = original.__doc__
    c10d.monitored_barrier = monitored_barrier
    _dist.monitored_barrier = monitored_barrier


_allow_monitored_barrier_on_shm()


def _store_failure_window():
    """Seconds to look for a dead rank after the store failed: 0.5, or two of the job's
    health-check intervals (SHMDIST_HEALTH_CHECK_MS, how often peers' processes are polled)
    if that is longer. (A malformed value is the C++ side's to refuse, at init.)"""
    import os
    try:
        interval_ms = float(os.environ.get("SHMDIST_HEALTH_CHECK_MS", "100"))
    except ValueError:
        interval_ms = 100.0
    return max(0.5, 2 * interval_ms / 1000)


class _PeerWatchingStore:
    """A store for torch's store-based barrier: before each of its polls (add, wait), checks
    the ranks of the world job on "shm" and raises PeerFailure naming one that died. Every
    other attribute is the store's own."""

    _SLICE_S = 0.1  # a wait is cut into slices this long, with a check before each

    def __init__(self, store, waiting_for):
        self._store = store
        self._waiting_for = waiting_for

    def __getattr__(self, name):
        return getattr(self._store, name)

    def _check(self):
        _C._check_world_peers(self._waiting_for)

    def _store_failed(self):
        """The store itself failed. Rank 0 hosts torch's TCPStore: when it dies, this says
        "Connection reset by peer" a moment before its process is seen gone. Names it if it
        is (PeerFailure); the caller re-raises the store's error otherwise."""
        until = _time.monotonic() + _store_failure_window()
        while _time.monotonic() < until:
            self._check()
            _time.sleep(0.01)

    def add(self, key, value):
        self._check()
        try:
            return self._store.add(key, value)
        except RuntimeError:
            self._store_failed()
            raise

    def wait(self, keys, timeout=None):
        # torch 2.1 and later wait on the store in slices of 10 s or more; a slice of ours
        # never goes below 1 ms, which a store would take for "no timeout".
        total = (self._store.timeout if timeout is None else timeout).total_seconds()
        deadline = _time.monotonic() + total if total > 0 else float("inf")
        while True:
            self._check()
            began = _time.monotonic()
            piece = max(0.001, min(self._SLICE_S, deadline - began))
            try:
                return self._store.wait(keys, _timedelta(seconds=piece))
            except RuntimeError:
                if _time.monotonic() >= deadline:
                    raise
                if _time.monotonic() - began < piece / 2:  # not its timeout: the store failed
                    self._store_failed()
                    raise


def _watch_peers_in_store_based_barrier():
    """torch's init_process_group and new_group end with a barrier on the store (torch 1.13
    and 2.0 always, later ones when TORCH_DIST_INIT_BARRIER=1), which knows nothing of
    processes: a rank that died after it joined the job kept the others there until the init
    timeout, with an error that names no rank. Each rank polls the store in that barrier; the
    store handed to it checks the job's ranks first, so the survivors raise PeerFailure naming
    the dead rank within a health-check interval (SHMDIST_HEALTH_CHECK_MS)."""
    from torch.distributed import distributed_c10d as c10d
    original = getattr(c10d, "_store_based_barrier", None)
    if original is None or getattr(original, "_shmdist", False):
        return

    def _store_based_barrier(rank, store, *args, **kwargs):
        waiting_for = "torch's store-based barrier at the end of init_process_group or new_group"
        if not _C._check_world_peers(waiting_for):  # no job on "shm" here: nothing to watch
            return original(rank, store, *args, **kwargs)
        return original(rank, _PeerWatchingStore(store, waiting_for), *args, **kwargs)

    _store_based_barrier._shmdist = True
    _store_based_barrier.__doc__ = original.__doc__
    c10d._store_based_barrier = _store_based_barrier


_watch_peers_in_store_based_barrier()

_default_group = _dist.distributed_c10d._get_default_group
_inference_all_reduce = _C._inference_all_reduce


def inference_all_reduce(tensor, op=_dist.ReduceOp.SUM, group=None):
    """dist.all_reduce(tensor, op, group) on a "shm" group, without torch.distributed's Python
    layer: reduces `tensor` in place on every member and returns it (as DeepSpeed's
    inference_all_reduce does). The same shmdist collective as dist.all_reduce on "shm": the
    same dtypes and reductions, the same result bit for bit, checked against the other
    members' calls (which may be dist.all_reduce), blocking with the GIL released while it
    waits. `tensor`: a contiguous CPU tensor (used in place, never copied); `group`: a group
    of backend "shm" on one host, None for the default group. Anything else raises
    shmdist.InvalidArgument naming what was expected, what was found and the global rank;
    a refused tensor or reduction also fails the other members' matching call at once.
    docs/torch.md "Direct all_reduce"."""
    _inference_all_reduce(_default_group() if group is None else group, tensor, op)
    return tensor


ProcessGroupShm = _C.ProcessGroupShm
ProcessGroupHosts = _hosts.ProcessGroupHosts
Error = _C.Error
InvalidArgument = _C.InvalidArgument
Timeout = _C.Timeout
PeerFailure = _C.PeerFailure
SetupError = _C.SetupError
NotInitialized = _C.NotInitialized
