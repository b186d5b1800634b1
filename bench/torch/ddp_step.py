#!/usr/bin/python3
"""DistributedDataParallel step time on "shm" against gloo: the same model, data and seeds on
either (tests/python/workers/ddp.py, which the test suite also uses to check that "shm"
trains bit for bit like gloo). For each model width it runs one job per backend, the backends
alternating, and prints the median step time (forward, backward with DDP's gradient
all-reduce, optimizer step) of rank 0 and the ratio; beside them "floor": the same job on
"shm" with every step inside DDP's no_sync(), so no gradient is all-reduced at all (the step
no backend can beat; issue 29's target: a "shm" step at most 1.05x the floor), and each
backend's ratio to it.

    PYTHONPATH=build/python /usr/bin/python3 bench/torch/ddp_step.py [--ranks 2]
        [--widths 64,512,2048] [--steps 40] [--rounds 3] [--timeout 300]

Each job is started as plain processes with torchrun's variables (env://), with a bounded run
time; every process is reaped. torch runs one intra-op thread per rank (ddp.py sets it), so
the figures are the communication's and the backend's cost on top of the same arithmetic.
"""

import argparse
import os
import pathlib
import signal
import socket
import statistics
import subprocess
import sys
import time

WORKER = pathlib.Path(__file__).resolve().parents[2] / "tests" / "python" / "workers" / "ddp.py"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(backend, ranks, width, steps, timeout):
    """Median step time (ms) of rank 0, and the parameter count. backend "floor": "shm"
    under no_sync (no gradient all-reduce)."""
    port = str(free_port())
    extra = ["--no-sync"] if backend == "floor" else []
    backend = "shm" if backend == "floor" else backend
    procs = []
    for r in range(ranks):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(ranks), LOCAL_RANK=str(r),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        procs.append(subprocess.Popen(
            [sys.executable, str(WORKER), backend, "--time", "--steps", str(steps),
             "--width", str(width)] + extra,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            process_group=0 if r == 0 else procs[0].pid))
    deadline = time.monotonic() + timeout
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=max(1, deadline - time.monotonic()))
            if p.returncode != 0:
                raise RuntimeError(f"{backend} width {width}: a rank exited {p.returncode}:\n{err}")
            outs.append(out)
    except subprocess.TimeoutExpired:
        os.killpg(procs[0].pid, signal.SIGKILL)
        for p in procs:
            p.communicate()
        raise RuntimeError(f"{backend} width {width}: the job did not finish within {timeout} s")
    for line in outs[0].splitlines():
        if line.startswith("STEP "):
            fields = dict(f.split("=") for f in line.split()[1:])
            return float(fields["median_ms"]), int(fields["params"])
    raise RuntimeError(f"{backend} width {width}: no STEP line in rank 0's output:\n{outs[0]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--widths", default="64,512,2048")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3, help="jobs per backend and width")
    ap.add_argument("--timeout", type=float, default=300, help="seconds, per job")
    args = ap.parse_args()
    import torch
    print(f"# DDP step time, {args.ranks} ranks, torch {torch.__version__}, {args.steps} steps "
          f"a job (median of the last 3/4), median over {args.rounds} jobs per backend")
    print(f"{'width':>6} {'params':>10} {'grad MiB':>9} {'floor ms':>9} {'shm ms':>9} "
          f"{'gloo ms':>9} {'gloo/shm':>9} {'shm/floor':>10} {'gloo/floor':>11}")
    backends = ("floor", "shm", "gloo")
    for width in (int(w) for w in args.widths.split(",")):
        times = {b: [] for b in backends}
        params = 0
        for i in range(args.rounds):
            k = i % len(backends)  # the order rotates between rounds
            for backend in backends[k:] + backends[:k]:
                ms, params = run_job(backend, args.ranks, width, args.steps, args.timeout)
                times[backend].append(ms)
        floor, shm, gloo = (statistics.median(times[b]) for b in backends)
        print(f"{width:>6} {params:>10} {params * 4 / 2**20:>9.2f} {floor:>9.3f} {shm:>9.3f} "
              f"{gloo:>9.3f} {gloo / shm:>8.2f}x {shm / floor:>9.2f}x {gloo / floor:>10.2f}x",
              flush=True)


if __name__ == "__main__":
    main()
