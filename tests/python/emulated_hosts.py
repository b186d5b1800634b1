"""Emulated hosts on one machine (issue 30): each host is a private mount namespace with its own
/dev/shm tmpfs (unshare -m, which needs root or user namespaces), so ranks on different hosts
cannot open each other's shared-memory objects, as on separate machines; they reach each
other over 127.0.0.1. Used by tests/python/test_hosts.py and bench/torch/hosts_bench.py
(bench/compare's section torch-hosts). Standard library only.

As a program it runs one env:// job across emulated hosts and prints the hosts' reports
(workers/host_launch.py's JSON objects, one list):

    emulated_hosts.py [--hosts 2x2] [--timeout S] [--env K=V ...] [--cpus per-host]
                      -- SCRIPT [ARGS ...]

It exits 1 when a rank failed or the job ran out of time (every process killed, reaped).

With `--cpus per-host` (and start_hosts' `cpus`), each host also gets CPUs of its own
(host_cpus: this process's CPUs split between the hosts), as separate machines have; by
default the hosts share every CPU, as the tests run them.
"""

import argparse
import json
import os
import pathlib
import random
import socket
import subprocess
import sys

WORKERS = pathlib.Path(__file__).resolve().parent / "workers"
HOST_LAUNCH = WORKERS / "host_launch.py"


def why_no_namespaces():
    """None if this process can give a child its own /dev/shm, else why not."""
    try:
        r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs tmpfs /dev/shm"], capture_output=True, text=True,
                           timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"cannot run unshare: {e}"
    if r.returncode != 0:
        return (f"cannot give a process its own /dev/shm (unshare -m as uid {os.getuid()}): "
                f"{r.stderr.strip()}")
    return None


def in_own_dev_shm(cmd):
    """cmd, run in a private mount namespace with a fresh tmpfs on /dev/shm."""
    return ["unshare", "-m", "--propagation", "private", "sh", "-c",
            'mount -t tmpfs tmpfs /dev/shm && exec "$@"', "emulated-host", *cmd]


def free_port():
    """A port that nothing listens on now, chosen below the kernel's ephemeral range
    (net.ipv4.ip_local_port_range) when it leaves room: a port from that range (bind to port
    0) can be taken by any outgoing connection (gloo's, a store client's) between this pick
    and the job's bind, which failed a test with "Address already in use" under load."""
    try:
        low = int(pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    candidates = random.sample(range(10000, low), min(200, low - 10000)) if low > 10200 else []
    for port in candidates + [0]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]


def host_cpus(n_hosts):
    """This process's CPUs split between `n_hosts` emulated hosts: host h gets the h-th of
    n_hosts contiguous, near-equal parts of the sorted list (with fewer CPUs than hosts, CPU
    h mod count), so that ranks of different hosts never share a CPU when there are enough:
    a list of sets."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < n_hosts:
        return [{cpus[h % len(cpus)]} for h in range(n_hosts)]
    return [set(cpus[len(cpus) * h // n_hosts:len(cpus) * (h + 1) // n_hosts])
            for h in range(n_hosts)]


def start_hosts(hosts, script, args=(), envs=None, timeout=150, python=None, cwd=None,
                fork=False, cpus=None):
    """Starts `script args` as an env:// job (MASTER_ADDR 127.0.0.1, a free MASTER_PORT), one
    emulated host per entry of `hosts` (the global ranks of each), through host_launch.py
    (which gives up on its ranks `timeout` - 20 s in; with `fork`, it imports torch once and
    forks its ranks). `envs[h]` is host h's environment (WORLD_SIZE, if not in it, is the
    number of ranks). All processes are in one process group, that of the first host's:
    os.killpg(procs[0].pid, 9) ends them all. `cpus[h]`, if given, is the set of CPUs host h's
    processes may run on (host_cpus). Returns the Popens."""
    port = str(free_port())
    world = sum(len(h) for h in hosts)
    procs = []
    for h, ranks in enumerate(hosts):
        env = dict(envs[h] if envs else os.environ)
        env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})
        env.setdefault("WORLD_SIZE", str(world))
        cmd = in_own_dev_shm([python or sys.executable, str(HOST_LAUNCH),
                              *(["--fork"] if fork else []), str(timeout - 20),
                              str(script), *map(str, ranks), "--", *args])
        kwargs = {"process_group": 0 if h == 0 else procs[0].pid}  # one group: killable at once
        if cpus is not None:
            kwargs["preexec_fn"] = (lambda mine: lambda: os.sched_setaffinity(0, mine))(cpus[h])
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=env, cwd=cwd or WORKERS,
                                      stdin=subprocess.DEVNULL, **kwargs))
    return procs


def wait_hosts(procs, timeout):
    """The hosts' reports, after every process ended; (None, why) if a host launcher failed or
    the job outlived `timeout` seconds (then every process was killed and reaped)."""
    reports = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            if p.returncode != 0:
                os.killpg(procs[0].pid, 9)
                for q in procs:
                    q.communicate()
                return None, f"host launcher: exit {p.returncode}\n{out}\n{err}"
            reports.append(json.loads(out))
    except subprocess.TimeoutExpired:
        os.killpg(procs[0].pid, 9)
        for p in procs:
            p.communicate()
        return None, f"the job across emulated hosts did not end within {timeout} s"
    return reports, ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", default="2x2", help="HOSTSxRANKS (default 2x2)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds for the whole job")
    ap.add_argument("--env", action="append", default=[], help="K=V for every rank")
    ap.add_argument("--cpus", choices=("shared", "per-host"), default="shared",
                    help="per-host: each host on CPUs of its own (host_cpus); default shared")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS ...]")
    a = ap.parse_args()
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command:
        ap.error("give the script to run after --")
    try:
        n_hosts, per_host = (int(x) for x in a.hosts.split("x"))
    except ValueError:
        ap.error(f"--hosts takes HOSTSxRANKS, such as 2x2, got {a.hosts!r}")
    why = why_no_namespaces()
    if why:
        print(f"emulated_hosts: {why}", file=sys.stderr)
        return 3
    env = dict(os.environ, **dict(kv.split("=", 1) for kv in a.env))
    hosts = [list(range(h * per_host, (h + 1) * per_host)) for h in range(n_hosts)]
    procs = start_hosts(hosts, os.path.abspath(command[0]), command[1:], [env] * n_hosts,
                        int(a.timeout), cwd=os.getcwd(),
                        cpus=host_cpus(n_hosts) if a.cpus == "per-host" else None)
    reports, why = wait_hosts(procs, a.timeout)
    if reports is None:
        print(f"emulated_hosts: {why}", file=sys.stderr)
        return 1
    print(json.dumps(reports))
    return 0 if all(r["rc"] == 0 for rep in reports for r in rep["ranks"]) else 1


if __name__ == "__main__":
    sys.exit(main())
