#!/usr/bin/python3
"""The same torch.distributed loops over backend "shm" (shmdist) and backend "gloo", in one run.

    PYTHONPATH=build/python /usr/bin/python3 bench/torch/torch_bench.py
        [--backends shm,gloo] [--ranks 2,4] [--tests latency,bw,allreduce,broadcast,allgather]
        [--min-size 4] [--max-size 16777216] [--budget 0.4] [--iterations N] [--warmup N]
        [--window 64] [--window-bytes 67108864] [--bind core|none] [--csv FILE]

For every rank count it runs each backend in turn, once for all the tests (the script starts
its own ranks, torchrun-style variables and env://), and prints one OSU-style table per test
and rank count:
the message size in bytes, then each backend's figure and the ratio gloo/shm (above 1: shm is
better). latency: ping-pong between ranks 0 and 1, half a round trip, us; bw: a window of
isends (64, fewer above 1 MiB so that a window holds at most 64 MiB) then an ack, MB/s
(10^6 bytes), ratio shm/gloo; allreduce (float32, SUM), broadcast and
allgather (the size is each rank's tensor): average time per call across ranks, us. latency
and bw run on 2 ranks only. With --bind core (the default) and no more ranks than CPUs, rank r
runs on CPU r, for both backends, as bench/compare binds the C++ loops (mpirun's default for
2 ranks); unbound, two ranks that land on one CPU stream a large message in turns. Exits 3,
printing nothing on stdout, when torch or the shm backend cannot be imported.

Iterations are bounded in time, so that gloo's slow sizes do not take minutes: at each size a
few warm-up iterations (at most half of --budget) estimate one iteration's time, the ranks
agree on the slowest estimate (an all_reduce MAX), and the timed loop runs --budget seconds'
worth of iterations, at least 5 and at most OSU's counts (2000 up to 64 KiB, 200 above; bw
100 and 20 windows). --iterations N runs exactly N (and --warmup N warm-ups) at every size.
The full set (5 tests, 4 B to 16 MiB, 2 and 4 ranks, both backends) takes about 3-5 minutes.
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
MIN_TIMED = 5  # iterations of a time-bounded loop, at least


def sizes(lo, hi):
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= 2
    return out


def loop_counts(size, args, test):
    """(most iterations, most warm-ups) at `size`: OSU's counts, or --iterations/--warmup."""
    if test == "bw":
        it, skip = (20, 2) if size > LARGE else (100, 10)
    else:
        it, skip = (200, 10) if size > LARGE else (2000, 50)
    return (args.iterations or it, skip if args.warmup is None else args.warmup)


def window_of(size, args):
    """Messages per bw window: --window, fewer where a window would exceed --window-bytes."""
    return max(1, min(args.window, args.window_bytes // max(1, size)))


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
    for test in args.tests:
        for size in sizes(args.min_size, args.max_size):
            most, skip = loop_counts(size, args, test)
            dist.barrier()
            step = globals()["step_" + test](dist, torch, me, world, size, args)
            iters = most if args.iterations else calibrate(dist, torch, step, most, skip, args)
            elapsed = timed(iters, 0 if not args.iterations else skip, step)
            figure = (size / 1e6 * iters * window_of(size, args) / elapsed if test == "bw"
                      else elapsed * 1e6 / (2.0 * iters) if test == "latency"
                      else elapsed * 1e6 / iters)
            if test not in P2P_TESTS:  # average across ranks
                t = torch.tensor([figure], dtype=torch.float64)
                dist.all_reduce(t)
                figure = t.item() / world
            if me == 0:
                print(f"{test} {size} {figure:.3f}", flush=True)
    dist.destroy_process_group()


def calibrate(dist, torch, step, most, skip, args):
    """Warms up and returns the timed loop's iteration count, the same on every rank (every
    count here is agreed through an all_reduce MAX: ranks that ran different numbers of
    steps would deadlock). One step pays the one-time costs (connections, first touch);
    then up to `skip` - 1 more, as many as fit in half the budget by the first step's time,
    estimate one step; the count is the budget over the slowest rank's estimate, within
    [MIN_TIMED, most]. A bystander (a p2p test's rank > 1, whose step does nothing) reports
    0 and takes the others' figures."""
    def slowest(seconds):
        t = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    start = time.perf_counter()
    step()
    first = slowest(time.perf_counter() - start)
    warm = max(0, min(skip - 1, int(args.budget / 2 / first) if first > 0 else skip - 1))
    start = time.perf_counter()
    for _ in range(warm):
        step()
    per_step = slowest((time.perf_counter() - start) / warm) if warm else first
    if per_step <= 0:
        return most
    return max(MIN_TIMED, min(most, int(args.budget / per_step)))


def timed(iters, skip, step):
    """Seconds that `iters` steps take after `skip` untimed ones."""
    start = 0.0
    for i in range(iters + skip):
        if i == skip:
            start = time.perf_counter()
        step()
    return time.perf_counter() - start


# Each step_<test> prepares its buffers and returns one iteration (a callable); a rank that
# takes no part (p2p tests: ranks > 1) gets a step that does nothing.

def step_latency(dist, torch, me, world, size, args):
    s = torch.full((size,), me + 1, dtype=torch.uint8)
    r = torch.zeros(size, dtype=torch.uint8)
    if me > 1:
        return lambda: None

    def step():
        if me == 0:
            dist.send(s, 1, tag=DATA_TAG)
            dist.recv(r, 1, tag=DATA_TAG)
        else:
            dist.recv(r, 0, tag=DATA_TAG)
            dist.send(s, 0, tag=DATA_TAG)
    return step


def step_bw(dist, torch, me, world, size, args):
    buf = torch.full((size,), me + 1, dtype=torch.uint8)
    ack = torch.zeros(4, dtype=torch.uint8)
    window = window_of(size, args)
    if me > 1:
        return lambda: None

    def step():
        if me == 0:
            for q in [dist.isend(buf, 1, tag=DATA_TAG) for _ in range(window)]:
                q.wait()
            dist.recv(ack, 1, tag=ACK_TAG)
        else:
            for q in [dist.irecv(buf, 0, tag=DATA_TAG) for _ in range(window)]:
                q.wait()
            dist.send(ack, 0, tag=ACK_TAG)
    return step


def step_allreduce(dist, torch, me, world, size, args):
    t = torch.ones(max(1, size // 4), dtype=torch.float32)
    return lambda: dist.all_reduce(t)


def step_broadcast(dist, torch, me, world, size, args):
    t = torch.ones(max(1, size // 4), dtype=torch.float32)
    return lambda: dist.broadcast(t, src=0)


def step_allgather(dist, torch, me, world, size, args):
    t = torch.ones(max(1, size // 4), dtype=torch.float32)
    out = [torch.empty_like(t) for _ in range(world)]
    return lambda: dist.all_gather(out, t)


# ---- the driver ------------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_backend(args, backend, tests, ranks):
    """Starts `ranks` workers running `tests`; returns {test: {size: figure}} from rank 0."""
    port = str(free_port())
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--backend", backend,
           "--bind", args.bind, "--tests", ",".join(tests), "--min-size", str(args.min_size),
           "--max-size", str(args.max_size), "--window", str(args.window),
           "--window-bytes", str(args.window_bytes), "--budget", str(args.budget)]
    if args.iterations:
        cmd += ["--iterations", str(args.iterations)]
    if args.warmup is not None:
        cmd += ["--warmup", str(args.warmup)]
    procs = []
    try:
        for r in range(ranks):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(ranks), LOCAL_RANK=str(r),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=port, OMP_NUM_THREADS="1")
            for k in ("SHMDIST_SEGMENT_FD", "SHMDIST_SEGMENT", "SHMDIST_JOB_KEY"):
                env.pop(k, None)
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
        out = procs[0].communicate(timeout=args.timeout)[0]
        codes = [procs[0].returncode] + [p.wait(timeout=args.timeout) for p in procs[1:]]
    finally:
        for p in procs:  # after a timeout or an interrupt: no rank outlives the driver
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(codes):
        sys.exit(f"torch_bench: {backend} {','.join(tests)} on {ranks} ranks failed "
                 f"(exit codes {codes})")
    results = {t: {} for t in tests}
    for line in out.splitlines():
        if line.strip():
            test, size, figure = line.split()
            results[test][int(size)] = float(figure)
    return results


def print_table(test, ranks, backends, results, rows):
    unit = "MB/s" if test == "bw" else "us"
    print(f"\n# {test}, {ranks} ranks ({unit})")
    ratio = len(backends) == 2
    cols = "".join(f"{b:>14}" for b in backends)
    print(f"{'# Size':<10}{cols}" + (f"{'ratio':>14}" if ratio else ""))
    for size in sorted(results[backends[0]][test]):
        vals = [results[b][test].get(size, float("nan")) for b in backends]
        line = f"{size:<10}" + "".join(f"{v:>14.2f}" for v in vals)
        if ratio:
            a, b = vals
            gain = (a / b if test == "bw" else b / a) if a and b else float("nan")
            line += f"{gain:>14.2f}"
        print(line, flush=True)
        for backend, v in zip(backends, vals):
            rows.append({"test": test, "ranks": ranks, "size": size, "backend": backend,
                         "figure": v, "unit": unit})


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
    began = time.monotonic()
    print(f"# torch.distributed over shm and gloo (torch {torch.__version__}), one run")
    counts = (f"{args.iterations} iterations" if args.iterations else
              f"iterations bounded to {args.budget:g} s per size and backend")
    print(f"# {counts}, ranks {'bound one per CPU' if args.bind == 'core' else 'unbound'}, "
          f"bw window {args.window} messages of at most {args.window_bytes >> 20} MiB in all")
    for ranks in args.ranks:
        tests = [t for t in args.tests if t not in P2P_TESTS or ranks == 2]
        if not tests:
            continue
        results = {b: run_backend(args, b, tests, ranks) for b in args.backends}
        for test in tests:
            print_table(test, ranks, args.backends, results, rows)
    print(f"\n# took {time.monotonic() - began:.0f} s")
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
    ap.add_argument("--budget", type=float, default=0.4,
                    help="seconds of timed iterations per size and backend (default 0.4)")
    ap.add_argument("--iterations", type=int, default=0,
                    help="exactly this many timed iterations at every size (no time bound)")
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--window-bytes", type=int, default=64 << 20,
                    help="bw: at most this many bytes in one window (default 64 MiB)")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--bind", choices=("core", "none"), default="core",
                    help="with no more ranks than CPUs, rank r runs on CPU r (default), or not")
    ap.add_argument("--csv", default="")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--backend", help=argparse.SUPPRESS)
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
