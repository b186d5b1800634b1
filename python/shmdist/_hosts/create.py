"""Creating groups across hosts: the world (probing which ranks share a host, starting the
watcher of deaths) and its sub-groups, which torch asks backend "shm" for.
"""

import atexit
import threading
import weakref

import torch.distributed as dist

from .. import _C
from .failures import _Deaths
from .group import ProcessGroupHosts
from .probe import _KEY, _one_host_by_launcher, find_hosts


_world = None  # a weak reference to the world's ProcessGroupHosts, while it lives
_groups = weakref.WeakSet()  # every ProcessGroupHosts of this process, while it lives


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
    hosts, prefix, machine = find_hosts(store, rank, size, timeout, ranks or list(range(size)))
    if len(hosts) == 1:
        return None
    group = _compose(store, prefix, rank, size, timeout, group_name, hosts,
                     ranks or list(range(size)), world_job=not ranks, machine=machine)
    _track(group)
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
             local_ranks=None, machine=0):
    """A ProcessGroupHosts over `hosts` (lists of group ranks). Its "shm" part is a job of its
    own per host (`local_ranks` None: the world's, or that of a group whose world is not on
    "shm") or a sub-group of this host's world job (`local_ranks`: the world job's ranks of
    this host's members, in group-rank order). `machine`: the group's ranks on this rank's
    machine (find_hosts): a host's job of its own counts its share of the machine's CPUs by
    it (embedding::join_through_store's machine_ranks), so that its waits give the CPU away
    instead of spinning on one that the other hosts' ranks need."""
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
                                     group_name, members, names,
                                     machine if local_ranks is None else 0)
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
    _track(group)
    return group


def _track(group):
    """Has `group`'s threads stopped at exit, before the interpreter finalizes (the runner of
    its posted collectives, the threads completing their futures, the payload sender, the
    mailboxes' receive threads): in_order._InOrder.stop says why."""
    global _stopping_at_exit
    if not _stopping_at_exit:
        atexit.register(_stop_groups)
        _stopping_at_exit = True
    _groups.add(group)


_stopping_at_exit = False


def _stop_groups():
    for group in list(_groups):
        group.stop_threads()
