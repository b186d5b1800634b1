"""Which ranks share a host (issue 30), found by the machine, not by launcher variables or host
names: every rank creates a small object in /dev/shm holding 128 random bits (a probe),
publishes its name and bits through the group's store, and opens the other ranks' probes; the
ranks whose bits it reads share its /dev/shm, which is what "shm" needs. Two containers or
mount namespaces with separate /dev/shm on one machine are two hosts; one host with many
agents is one. The probes are removed as soon as every rank has looked (and on every failure).
"""

import os
import re
import secrets
import time


from .. import _C


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


def _kernel():
    """This machine's kernel instance (its boot id), "-" if unknown: hosts whose ranks read
    the same one (containers or mount namespaces of one machine, each with its own /dev/shm)
    share its CPUs."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        return "-"
    return boot if re.fullmatch(r"[0-9a-f-]{1,64}", boot) else "-"


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
    group ranks, hosts ordered by their lowest rank; the store prefix of this probe (for the
    groups made next); and how many ranks of the group run on this rank's machine (its
    kernel, _kernel: more than its host's when emulated hosts share the machine's CPUs).
    Every member calls it with the same store; it leaves nothing in /dev/shm, also when it
    raises."""
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
        kernel = _kernel()
        store.set(prefix + "probe/" + str(rank), str(size) + " " + name + " " + token + " " +
                  kernel)
        probe.here("probe")
        mates = []
        machine = 0
        for r in range(size):
            text = probe.get(r, "publish their host probe", "probe")
            fields = text.split(" ")
            if len(fields) != 4 or not fields[1].startswith("shmdist-") or "/" in fields[1]:
                probe.fail("the store's host probe of rank " + str(r) + " is '" + text +
                           "': expected '<world size> <name> <token> <boot id>' written by "
                           "shmdist; is another program (or another shmdist release) using "
                           "the same store?")
            if kernel != "-" and fields[3] == kernel:
                machine += 1
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
    return hosts, prefix, max(machine, len(next(h for h in hosts if rank in h)))


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
