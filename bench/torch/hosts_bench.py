#!/usr/bin/python3
"""One torch job across emulated hosts (issue 30): backend "shm" (shm inside each host, gloo
between hosts) or pure gloo, on HOSTS x RANKS ranks, each host a private mount namespace with
its own /dev/shm (tests/python/emulated_hosts.py, as tests/python/test_hosts.py runs them).

    PYTHONPATH=build/python-torch2.13 .venv/bin/python bench/torch/hosts_bench.py
        allreduce --backend shm [--hosts 2x2] [--min-size 4] [--max-size 16777216]
        [--budget 0.3] [--iterations N] [--warmup N] [--timeout 600] [--cpus per-host]
    ... hosts_bench.py ddp --backend gloo [--hosts 2x2] [--width 512] [--steps 40]

allreduce: the loop of bench/torch/allreduce_peers.py (float32 SUM, one checked call, then a
time-bounded timed loop per size; the mean time per call over the ranks), sizes doubling from
--min-size to --max-size. ddp: tests/python/workers/ddp.py --time (bench/torch/ddp_step.py's
job): the median step time of rank 0. Every rank runs with OMP_NUM_THREADS=1, not bound to
a CPU of its own; with --cpus per-host (the default) each host's ranks run on CPUs of that
host's own (emulated_hosts.host_cpus: this machine's CPUs split between the hosts, one each
on 2 CPUs and 2 hosts), as on separate machines, where one host's ranks never take another
host's CPU; --cpus shared lets every rank run on every CPU. docs/hosts.md says why it
matters: with shared CPUs the kernel at times puts both hosts' leaders, and the gloo step
between them, on one CPU.
bench/compare runs it once per backend, test and round, gated on the floor probe (section
torch-hosts, comparelib/torch_hosts_section.py), and prints the tables.

Output: '#' comments, then one row per figure:
    allreduce BACKEND SIZE_BYTES US_PER_CALL
    ddp BACKEND WIDTH MS_PER_STEP PARAMS
Exits 3 (nothing on stdout) when this machine cannot make mount namespaces or torch or
shmdist.torch cannot be imported, 1 when the job failed.
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys

sys.dont_write_bytecode = True
REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "python"))
from emulated_hosts import host_cpus, start_hosts, wait_hosts, why_no_namespaces  # noqa: E402

PEERS = REPO / "bench" / "torch" / "allreduce_peers.py"
DDP = REPO / "tests" / "python" / "workers" / "ddp.py"


def job_env():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # The ranks run in tests/python/workers: a relative PYTHONPATH would point elsewhere.
    env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in
                                        env.get("PYTHONPATH", "").split(os.pathsep) if p)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
              "MASTER_PORT", "SHMDIST_SEGMENT_FD", "SHMDIST_SEGMENT", "SHMDIST_JOB_KEY"):
        env.pop(k, None)
    return env


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("test", choices=("allreduce", "ddp"))
    ap.add_argument("--backend", choices=("shm", "gloo"), required=True)
    ap.add_argument("--hosts", default="2x2", help="HOSTSxRANKS (default 2x2)")
    ap.add_argument("--min-size", type=int, default=4)
    ap.add_argument("--max-size", type=int, default=16 << 20)
    ap.add_argument("--budget", type=float, default=0.3,
                    help="allreduce: seconds of timed calls per size (default 0.3)")
    ap.add_argument("--iterations", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--width", type=int, default=512, help="ddp: the model's width")
    ap.add_argument("--steps", type=int, default=40, help="ddp: steps (median of the last 3/4)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds for the job")
    ap.add_argument("--cpus", choices=("per-host", "shared"), default="per-host",
                    help="per-host (default): each host's ranks on CPUs of its own; shared: "
                         "every rank on every CPU")
    a = ap.parse_args()
    try:
        n_hosts, per_host = (int(x) for x in a.hosts.split("x"))
    except ValueError:
        ap.error(f"--hosts takes HOSTSxRANKS, such as 2x2, got {a.hosts!r}")
    why = why_no_namespaces()
    if why:
        print(f"hosts_bench: {why}", file=sys.stderr)
        return 3
    probe = subprocess.run([sys.executable, "-c", "import torch, shmdist.torch; "
                            "print(torch.__version__)"], capture_output=True, text=True)
    if probe.returncode != 0:
        print(f"hosts_bench: cannot import torch and shmdist.torch with {sys.executable} "
              f"({(probe.stderr.strip().splitlines() or [''])[-1]}); build the backend for "
              "this interpreter's torch and set PYTHONPATH=<build>/python[-torch<version>]",
              file=sys.stderr)
        return 3
    if a.test == "allreduce":
        script = PEERS
        args = ["--worker", "--backend", a.backend, "--threads", "1", "--bind", "none",
                "--dtypes", "float32", "--min-size", str(a.min_size),
                "--max-size", str(a.max_size), "--budget", str(a.budget)]
        if a.iterations:
            args += ["--iterations", str(a.iterations)]
        if a.warmup is not None:
            args += ["--warmup", str(a.warmup)]
    else:
        script = DDP
        args = [a.backend, "--time", "--steps", str(a.steps), "--width", str(a.width)]
    hosts = [list(range(h * per_host, (h + 1) * per_host)) for h in range(n_hosts)]
    cpus = host_cpus(n_hosts) if a.cpus == "per-host" else None
    procs = start_hosts(hosts, script, args, [job_env()] * n_hosts, int(a.timeout), cpus=cpus)
    reports, why = wait_hosts(procs, a.timeout)
    if reports is None:
        print(f"hosts_bench: {a.test} {a.backend}: {why}", file=sys.stderr)
        return 1
    ranks = {r["rank"]: r for rep in reports for r in rep["ranks"]}
    # torch 2.13's gloo with DDP aborts in the interpreter's teardown, after the work is done
    # and printed, in about 1 process of 6 ("terminate called without an active exception";
    # see tests/python/workers/ddp.py): "shm" across hosts holds gloo groups too. A rank that
    # printed its last line (PARAMS) and then aborted so counts, with a note.
    torn = [r for r in ranks.values() if a.test == "ddp" and r["rc"] == -6
            and f"PARAMS rank={r['rank']}" in r["out"]
            and "terminate called without an active exception" in r["err"]]
    failed = [r for r in ranks.values() if r["rc"] != 0 and r not in torn]
    left = [n for rep in reports for n in rep["left_in_dev_shm"]]
    if failed:
        r = failed[0]
        print(f"hosts_bench: {a.test} {a.backend}: rank {r['rank']} exited {r['rc']}:\n"
              f"{r['err'][-2000:]}", file=sys.stderr)
        return 1
    print(f"# {a.test} on {n_hosts} emulated hosts x {per_host} ranks, backend {a.backend}, "
          f"torch {probe.stdout.strip()}, OMP_NUM_THREADS=1, " +
          ("each host on CPUs of its own: " + " | ".join(
              ",".join(map(str, sorted(c))) for c in cpus) if cpus else
           "every rank on every CPU"))
    for r in torn:
        print(f"# note: rank {r['rank']} aborted in torch's teardown after its work "
              "(terminate called without an active exception)")
    if left:
        print(f"# warning: left in the hosts' /dev/shm: {' '.join(left)}")
    out = ranks[0]["out"]
    for line in out.splitlines():
        parts = line.split()
        if a.test == "allreduce" and len(parts) == 4 and parts[:2] == [a.backend, "float32"]:
            print(f"allreduce {a.backend} {parts[2]} {parts[3]}")
        elif a.test == "ddp" and line.startswith("STEP "):
            fields = dict(f.split("=") for f in parts[1:])
            print(f"ddp {a.backend} {a.width} {fields['median_ms']} {fields['params']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
