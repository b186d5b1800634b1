"""One emulated host of tests/python/test_hosts.py: run inside a private mount namespace with
its own /dev/shm tmpfs, it starts the given ranks of an env:// job (MASTER_ADDR, MASTER_PORT,
WORLD_SIZE come from the environment), waits for them (bounded), and prints one JSON line:
every rank's exit code and output, and what the ranks left in this host's /dev/shm (which
vanishes with the namespace, so only this process can look).

    host_launch.py [--fork] <timeout s> <script> <rank> [<rank> ...] [-- <script args>]

Each rank is `python <script> <script args>` with RANK set. With --fork this process imports
torch once and forks every rank from it, which then runs the script as its __main__ and ends
through the interpreter's own exit (atexit handlers, exit code, uncaught exception's traceback
and exit 1 as with `python <script>`). The ranks are spared importing torch each (about 1.5 s
of CPU a rank, most of a short test's time on 2 CPUs); torch's own test harness forks its ranks
the same way (tests/python/torch_suite/run_dist.py --start fork).
"""

import json
import os
import runpy
import selectors
import signal
import subprocess
import sys
import time

fork = sys.argv[1:2] == ["--fork"]
argv = sys.argv[2:] if fork else sys.argv[1:]
timeout = float(argv[0])
script = argv[1]
rest = argv[2:]
args = rest[rest.index("--") + 1:] if "--" in rest else []
ranks = rest[:rest.index("--")] if "--" in rest else rest
deadline = time.monotonic() + timeout


def spawned():
    """The ranks as fresh interpreters; returns their results in rank order."""
    procs = []
    for rank in ranks:
        env = dict(os.environ, RANK=rank)
        procs.append(subprocess.Popen([sys.executable, script, *args], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    results = []
    for rank, p in zip(ranks, procs):
        try:
            out, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                if q.poll() is None:
                    q.kill()
            out, err = p.communicate()
            err += "\n[host_launch: killed at its timeout of %s s]" % timeout
        results.append({"rank": int(rank), "rc": p.returncode, "out": out, "err": err})
    return results


def forked_rank(rank, out_w, err_w, pipes):
    """In the child: becomes `python <script>` for `rank`. Returns only by raising SystemExit
    (or the script's uncaught exception), which the interpreter's exit then handles."""
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    for fd in pipes:
        os.close(fd)
    os.environ["RANK"] = rank
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")
    sys.exit(0)


def reap_forked(children):
    """The parent's part: reads every child's output until it closes and reaps the children;
    at the deadline it kills those still running (only their texts say so), and it waits at
    most 10 s past it (a grandchild may hold an output open). Returns their results in rank
    order (rc None for a rank it could not reap)."""
    sel = selectors.DefaultSelector()
    texts = {}
    for rank, pid, out_r, err_r in children:
        for fd in (out_r, err_r):
            texts[fd] = bytearray()
            sel.register(fd, selectors.EVENT_READ)
    status = {}  # pid -> wait status, once reaped
    killed = set()

    def reap(block):
        for _, pid, _, _ in children:
            if pid not in status:
                done, st = os.waitpid(pid, 0 if block else os.WNOHANG)
                if done:
                    status[pid] = st

    def kill_the_rest():
        reap(False)
        for _, pid, _, _ in children:
            if pid not in status and pid not in killed:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)

    while sel.get_map() or len(status) < len(children):
        left = deadline - time.monotonic()
        if left <= 0:
            kill_the_rest()
            if left < -10:  # a grandchild holds an output open, or an end never comes
                break
        if not sel.get_map():  # every output closed: wait for the ends
            reap(False)
            if len(status) < len(children):
                time.sleep(0.05)
            continue
        for key, _ in sel.select(timeout=max(0.05, min(left, 1.0))):
            chunk = os.read(key.fd, 65536)
            if chunk:
                texts[key.fd] += chunk
            else:
                sel.unregister(key.fd)
                os.close(key.fd)
    results = []
    for rank, pid, out_r, err_r in children:
        err = texts[err_r].decode(errors="replace")
        if pid in killed:
            err += "\n[host_launch: killed at its timeout of %s s]" % timeout
        rc = os.waitstatus_to_exitcode(status[pid]) if pid in status else None
        results.append({"rank": int(rank), "rc": rc,
                        "out": texts[out_r].decode(errors="replace"), "err": err})
    return results


if fork:
    import torch  # noqa: F401  (the point: once, before the forks)
    import torch.distributed  # noqa: F401

    sys.stdout.flush()
    sys.stderr.flush()
    children = []
    pipes = []
    for rank in ranks:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            forked_rank(rank, out_w, err_w, pipes + [out_r, out_w, err_r, err_w])
        os.close(out_w)
        os.close(err_w)
        pipes += [out_r, err_r]
        children.append((rank, pid, out_r, err_r))
    results = reap_forked(children)
else:
    results = spawned()
print(json.dumps({"ranks": results, "left_in_dev_shm": sorted(os.listdir("/dev/shm"))}),
      flush=True)
if fork:
    os._exit(0)  # nothing of this process to finalize; torch's teardown took 0.5 s a host
