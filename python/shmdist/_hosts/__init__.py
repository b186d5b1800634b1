"""Backend "shm" across hosts (issue 30): ranks on one host talk through that host's segment,
ranks on different hosts through gloo, created inside the backend from the same store.
docs/hosts.md says what works, in what order reductions go, and what is refused.

    probe      which ranks share a host (they can open each other's /dev/shm objects)
    create     the world group across hosts and its sub-groups
    group      ProcessGroupHosts: every operation, "shm" inside a host, gloo between
    agreement  a collective's members agree on it before gloo moves data
    link       the leaders' connections, over which their agreement frames go
    in_order   asynchronous collectives run in posting order on the group's thread
    mailbox    point-to-point across hosts: headers, payloads, matching receives
    failures   a rank that died anywhere is named by every survivor
    ops        reduction operations: kinds, names, how host partials combine
    works      Work objects
"""

from .create import create
from .group import ProcessGroupHosts
from .probe import find_hosts

__all__ = ["create", "ProcessGroupHosts", "find_hosts"]
