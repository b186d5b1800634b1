"""One emulated host of tests/python/test_hosts.py: run inside a private mount namespace with
its own /dev/shm tmpfs, it starts the given ranks of an env:// job (MASTER_ADDR, MASTER_PORT,
WORLD_SIZE come from the environment), waits for them (bounded), and prints one JSON line:
every rank's exit code and output, and what the ranks left in this host's /dev/shm (which
vanishes with the namespace, so only this process can look).

    host_launch.py <timeout s> <script> <rank> [<rank> ...] [-- <script args>]
"""

import json
import os
import subprocess
import sys
import time

timeout = float(sys.argv[1])
script = sys.argv[2]
rest = sys.argv[3:]
args = rest[rest.index("--") + 1:] if "--" in rest else []
ranks = rest[:rest.index("--")] if "--" in rest else rest

procs = []
for rank in ranks:
    env = dict(os.environ, RANK=rank)
    procs.append(subprocess.Popen([sys.executable, script, *args], env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE))
deadline = time.monotonic() + timeout
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
print(json.dumps({"ranks": results, "left_in_dev_shm": sorted(os.listdir("/dev/shm"))}))
