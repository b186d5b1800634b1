#!/usr/bin/python3
"""The same torch.distributed loops over backend "shm" (shmdist) and backend "gloo", in one run.

    PYTHONPATH=build/python /usr/bin/python3 bench/torch/torch_bench.py
        [--backends shm,gloo] [--ranks 2,4] [--tests latency,bw,allreduce,broadcast,allgather]
        [--min-size 4] [--max-size 16777216] [--iterations N] [--warmup N] [--window 64]
        [--bind core|none] [--csv FILE]

For every test and rank count it runs each backend in turn (the script starts its own ranks,
torchrun-style variables and env://), and prints one OSU-style table per test and rank count:
the message size in bytes, then each backend's figure and the ratio gloo/shm (above 1: shm is
better). latency: ping-pong between ranks 0 and 1, half a round trip, us; bw: a window of
isends then an ack, MB/s (10^6 bytes), ratio shm/gloo; allreduce (float32, SUM), broadcast and
allgather (the size is each rank's tensor): average time per call across ranks, us. latency
and bw run on 2 ranks only. With --bind core (the default) and no more ranks than CPUs, rank r
runs on CPU r, for both backends, as bench/compare binds the C++ loops (mpirun's default for
2 ranks); unbound, two ranks that land on one CPU stream a large message in turns. Exits 3, printing nothing on stdout, when torch or the shm backend
cannot be imported.
"""
import argparse
import csv
import os
import socket
import subprocess
import sys
import time

P2P_TESTS = ("latency", "bw")
ALL_TESTS = ("latency", "bw", "allreduce", "broadcast", "allgather")
DATA_TAG, ACK_TAG = 100, 101
LARGE = 65536


def sizes(lo, hi):
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= 2
    return out


def loop_counts(size, args, test):
    if test == "bw":
        it, skip = (20, 2) if size > LARGE else (100, 10)
    else:
        it, skip = (200, 10) if size > LARGE else (2000, 50)
    return (args.iterations or it, skip if args.warmup is None else args.warmup)


# ---- one rank --------------------------------------------------------------------------

def worker(args):
    me_env, world_env = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cpus = sorted(os.sched_getaffinity(0))
    if args.bind == "core" and world_env <= len(cpus):
        os.sched_setaffinity(0, {cpus[me_env]})
    import torch
    import torch.distributed as dist
    if args.backend == "shm":
        import shmdist.torch  # noqa: F401
    dist.init_process_group(backend=args.backend)
    me, world = dist.get_rank(), dist.get_world_size()
    for size in sizes(args.min_size, args.max_size):
        iters, skip = loop_counts(size, args, args.test)
        dist.barrier()
        elapsed = globals()["loop_" + args.test](dist, torch, me, world, size, iters, skip, args)
        figure = (size / 1e6 * iters * args.window / elapsed if args.test == "bw"
                  else elapsed * 1e6 / (2.0 * iters) if args.test == "latency"
                  else elapsed * 1e6 / iters)
        if args.test not in P2P_TESTS:  # average across ranks
            t = torch.tensor([figure], dtype=torch.float64)
            dist.all_reduce(t)
            figure = t.item() / world
        if me == 0:
            print(f"{size} {figure:.3f}", flush=True)
    dist.destroy_process_group()


def timed(iters, skip, step):
    start = 0.0
    for i in range(iters + skip):
        if i == skip:
            start = time.perf_counter()
        step()
    return time.perf_counter() - start


def loop_latency(dist, torch, me, world, size, iters, skip, args):
    s = torch.full((size,), me + 1, dtype=torch.uint8)
    r = torch.zeros(size, dtype=torch.uint8)
    if me > 1:
        return timed(0, 0, lambda: None) or 1.0

    def step():
        if me == 0:
            dist.send(s, 1, tag=DATA_TAG)
            dist.recv(r, 1, tag=DATA_TAG)
        else:
            dist.recv(r, 0, tag=DATA_TAG)
            dist.send(s, 0, tag=DATA_TAG)
    return timed(iters, skip, step)


def loop_bw(dist, torch, me, world, size, iters, skip, args):
    buf = torch.full((size,), me + 1, dtype=torch.uint8)
    ack = torch.zeros(4, dtype=torch.uint8)
    if me > 1:
        return 1.0

    def step():
        if me == 0:
            for q in [dist.isend(buf, 1, tag=DATA_TAG) for _ in range(args.window)]:
                q.wait()
            dist.recv(ack, 1, tag=ACK_TAG)
        else:
            for q in [dist.irecv(buf, 0, tag=DATA_TAG) for _ in range(args.window)]:
                q.wait()
            dist.send(ack, 0, tag=ACK_TAG)
    return timed(iters, skip, step)


def loop_allreduce(dist, torch, me, world, size, iters, skip, args):
    t = torch.ones(max(1, size // 4), dtype=torch.float32)
    return timed(iters, skip, lambda: dist.all_reduce(t))


def loop_broadcast(dist, torch, me, world, size, iters, skip, args):
    t = torch.ones(max(1, size // 4), dtype=torch.float32)
    return timed(iters, skip, lambda: dist.broadcast(t, src=0))


def loop_allgather(dist, torch, me, world, size, iters, skip, args):
    t = torch.ones(max(1, size // 4), dtype=torch.float32)
    out = [torch.empty_like(t) for _ in range(world)]
    return timed(iters, skip, lambda: dist.all_gather(out, t))


# ---- the driver ------------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_backend(args, backend, test, ranks):
    """Starts `ranks` workers; returns {size: figure} from rank 0."""
    port = str(free_port())
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--backend", backend,
           "--bind", args.bind, "--test", test, "--min-size", str(args.min_size), "--max-size", str(args.max_size),
           "--window", str(args.window)]
    if args.iterations:
        cmd += ["--iterations", str(args.iterations)]
    if args.warmup is not None:
        cmd += ["--warmup", str(args.warmup)]
    procs = []
    for r in range(ranks):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(ranks), LOCAL_RANK=str(r),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port, OMP_NUM_THREADS="1")
        for k in ("SHMDIST_SEGMENT_FD", "SHMDIST_SEGMENT", "SHMDIST_JOB_KEY"):
            env.pop(k, None)
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
    out = procs[0].communicate(timeout=args.timeout)[0]
    codes = [procs[0].returncode] + [p.wait(timeout=args.timeout) for p in procs[1:]]
    if any(codes):
        sys.exit(f"torch_bench: {backend} {test} on {ranks} ranks failed (exit codes {codes})")
    return {int(a): float(b) for a, b in (line.split() for line in out.splitlines() if line.strip())}


def driver(args):
    try:
        import torch  # noqa: F401
        import shmdist.torch  # noqa: F401
    except ImportError as e:
        print(f"torch_bench: cannot import torch and shmdist.torch ({e}); build the backend and "
              "set PYTHONPATH=<build>/python", file=sys.stderr)
        return 3
    import torch
    rows = []
    print(f"# torch.distributed over shm and gloo (torch {torch.__version__}), one run")
    for test in args.tests:
        for ranks in args.ranks:
            if test in P2P_TESTS and ranks != 2:
                continue
            results = {b: run_backend(args, b, test, ranks) for b in args.backends}
            unit = "MB/s" if test == "bw" else "us"
            print(f"\n# {test}, {ranks} ranks ({unit})")
            ratio = len(args.backends) == 2
            cols = "".join(f"{b:>14}" for b in args.backends)
            print(f"{'# Size':<10}{cols}" + (f"{'ratio':>14}" if ratio else ""))
            for size in sorted(results[args.backends[0]]):
                vals = [results[b].get(size, float("nan")) for b in args.backends]
                line = f"{size:<10}" + "".join(f"{v:>14.2f}" for v in vals)
                if ratio:
                    a, b = vals
                    gain = (a / b if test == "bw" else b / a) if a and b else float("nan")
                    line += f"{gain:>14.2f}"
                print(line, flush=True)
                for backend, v in zip(args.backends, vals):
                    rows.append({"test": test, "ranks": ranks, "size": size, "backend": backend,
                                 "figure": v, "unit": unit})
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["test", "ranks", "size", "backend", "figure", "unit"])
            w.writeheader()
            w.writerows(rows)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="shm,gloo", type=lambda s: s.split(","))
    ap.add_argument("--ranks", default="2,4", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--tests", default=",".join(ALL_TESTS), type=lambda s: s.split(","))
    ap.add_argument("--min-size", type=int, default=4)
    ap.add_argument("--max-size", type=int, default=16 << 20)
    ap.add_argument("--iterations", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--bind", choices=("core", "none"), default="core",
                    help="with no more ranks than CPUs, rank r runs on CPU r (default), or not")
    ap.add_argument("--csv", default="")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--backend", help=argparse.SUPPRESS)
    ap.add_argument("--test", help=argparse.SUPPRESS)
    args = ap.parse_args()
    for t in args.tests:
        if t not in ALL_TESTS:
            ap.error(f"unknown test {t!r}; expected some of {','.join(ALL_TESTS)}")
    if args.worker:
        worker(args)
        return 0
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
