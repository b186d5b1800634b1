#!/usr/bin/python3
"""Where the time of a torch.distributed call goes: the same 8-byte ping-pong between two
ranks, timed along four paths in one process, rounds interleaved.

    PYTHONPATH=build/python /usr/bin/python3 bench/torch/overhead.py
        [--backends shm,gloo,null] [--op pingpong|allreduce] [--size 8] [--iterations 20000]
        [--rounds 5] [--count] [--dtype float32]

Paths, each a half round trip in us (one send on one rank, the matching recv on the other):
  dist     dist.send / dist.recv (torch's Python layer, distributed_c10d.py, then as below)
  method   group.send([t], peer, tag).wait() on the ProcessGroup object (torch's pybind
           bindings, its dispatcher and the backend; skips distributed_c10d.py)
  c10d     the same calls in C++ (c10d::ProcessGroup::send/recv + Work::wait): the backend
           alone, without Python (any backend; gloo too)
  shmdist  shmdist's own blocking send/recv in C++ ("shm" only)
Then the differences: torch's Python layer (dist - method), torch's binding layer (method -
c10d), the backend's c10d adapter (c10d - shmdist) and the total Python-level overhead over
the C++ call (dist - c10d). Each figure is the median over the rounds.

--op allreduce times (or counts) an all_reduce (SUM) of a float32 (or --dtype) tensor of
--size bytes instead, along the same four paths (dist.all_reduce, group.allreduce([t]).wait(), c10d's
allreduce in C++, shmdist's all_reduce in C++), per call.

Backend "null" is the floor: a c10d::ProcessGroup in shmdist._C whose send and recv do
nothing and return an already completed Work (registered here as "shmdist_null"; it moves no
data). Its dist, method and c10d figures are what torch's layers cost any backend; with "shm"
and "null" in one run, the lines after the table give "shm"'s cost above that floor, from
Python (dist) and from C++ (c10d), and the Python-level overhead of each over its C++ call.
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

TAG = 7
NULL_BACKEND = "shmdist_null"  # the floor (see above): what torch.distributed itself costs


def make_paths(args, dist, group, t, peer):
    """{path: run(pattern, n)} for the patterns "pingpong", "send", "recv" and "allreduce"."""
    from shmdist import _C  # the C++ loops (any backend's ProcessGroup)
    me = dist.get_rank()

    def steps(pattern):
        if pattern == "pingpong":
            return ("send", "recv") if me == 0 else ("recv", "send")
        return (pattern,)

    def py_dist(pattern, n):
        if pattern == "allreduce":
            all_reduce = dist.all_reduce
            start = time.perf_counter()
            for _ in range(n):
                all_reduce(t)
            return time.perf_counter() - start
        ops = [(dist.send if s == "send" else dist.recv) for s in steps(pattern)]
        start = time.perf_counter()
        for _ in range(n):
            for op in ops:
                op(t, peer, tag=TAG)
        return time.perf_counter() - start

    def py_method(pattern, n):
        ts = [t]
        if pattern == "allreduce":
            allreduce = group.allreduce
            start = time.perf_counter()
            for _ in range(n):
                allreduce(ts).wait()
            return time.perf_counter() - start
        ops = [(group.send if s == "send" else group.recv) for s in steps(pattern)]
        start = time.perf_counter()
        for _ in range(n):
            for op in ops:
                op(ts, peer, TAG).wait()
        return time.perf_counter() - start

    paths = {"dist": py_dist, "method": py_method,
             "c10d": lambda pattern, n: _C._cxx_loop(group, "c10d", pattern, t, peer, n, TAG)}
    if args.backend == "shm":
        paths["shmdist"] = lambda pattern, n: _C._cxx_loop(group, "shmdist", pattern, t, peer,
                                                           n, TAG)
    return paths


def t_size(torch, dtype):
    return torch.tensor([], dtype=dtype).element_size()


def worker(args):
    import torch
    import torch.distributed as dist
    if args.backend == "shm":
        import shmdist.torch  # noqa: F401
    from shmdist import _C
    backend = args.backend
    if backend == "null":
        backend = NULL_BACKEND
        if NULL_BACKEND.upper() not in dist.Backend._plugins:
            dist.Backend.register_backend(NULL_BACKEND, _C._create_null_process_group)
    dist.init_process_group(backend=backend)
    me = dist.get_rank()
    group = dist.distributed_c10d._get_default_group()
    if args.op == "allreduce":
        dtype = getattr(torch, args.dtype)
        t = torch.zeros(max(1, args.size // t_size(torch, dtype)), dtype=dtype)
    else:
        t = torch.zeros(args.size, dtype=torch.uint8)
    peer = 1 - me
    paths = make_paths(args, dist, group, t, peer)
    names = list(paths)
    n = args.iterations
    if args.count:
        # Rank 0 runs under callgrind, rank 1 natively (much faster): rank 0's sends always
        # find room, and its receives find their messages already there (rank 1 sends them,
        # then a message on another tag that rank 0 awaits before counting), so no count
        # includes waiting. Each path runs once uncounted first (lazy symbol binding, caches).
        other = torch.zeros(args.size, dtype=torch.uint8)
        go = torch.zeros(1, dtype=torch.uint8)
        patterns = ("allreduce",) if args.op == "allreduce" else ("send", "recv")
        for counted in (False, True):
            for name in names:
                for pattern in patterns:
                    dist.barrier()
                    if me == 0:
                        if pattern == "recv":
                            dist.recv(go, peer, tag=TAG + 1)
                        if counted:
                            _C._callgrind("zero")
                        paths[name](pattern, n)
                        if counted:
                            _C._callgrind(f"{name}-{pattern}")
                    elif pattern == "allreduce":  # rank 0's partner, ahead of it
                        for _ in range(n):
                            dist.all_reduce(t)
                    else:
                        for _ in range(n):
                            if pattern == "send":
                                dist.recv(other, peer, tag=TAG)
                            else:
                                dist.send(other, peer, tag=TAG)
                        if pattern == "recv":
                            dist.send(go, peer, tag=TAG + 1)
    else:
        figures = {p: [] for p in paths}
        for rnd in range(args.rounds + 1):  # round 0 warms up
            for i in range(len(names)):
                name = names[(i + rnd) % len(names)]  # rotate the order between rounds
                dist.barrier()
                if args.op == "allreduce":
                    seconds = paths[name]("allreduce", n) * 2  # per call, not per half trip
                else:
                    seconds = paths[name]("pingpong", n)
                if rnd:
                    figures[name].append(seconds * 1e6 / (2 * n))
        if me == 0:
            for name in names:
                print(f"{name} {statistics.median(figures[name]):.4f}", flush=True)
    if args.backend == "null":
        # Its barrier does nothing, yet rank 0 hosts the store: it must leave last, or a
        # slower rank still inside init_process_group loses the store ("Broken pipe").
        store = dist.distributed_c10d._get_default_store()
        if me == 0:
            store.wait([f"overhead-done-{r}" for r in range(1, dist.get_world_size())])
        else:
            store.set(f"overhead-done-{me}", "1")
    else:
        dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_backend(args, backend):
    port = str(free_port())
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--backend", backend,
           "--op", args.op, "--size", str(args.size), "--iterations", str(args.iterations),
           "--rounds", str(args.rounds), "--dtype", args.dtype] + (["--count"] if args.count else [])
    outdir = tempfile.mkdtemp(prefix="shmdist-overhead-") if args.count else None
    procs = []
    for r in range(2):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port, OMP_NUM_THREADS="1")
        for k in ("SHMDIST_SEGMENT_FD", "SHMDIST_SEGMENT", "SHMDIST_JOB_KEY"):
            env.pop(k, None)
        prefix = []
        if args.count and r == 0:
            prefix = ["valgrind", "--tool=callgrind", "--quiet",
                      "--callgrind-out-file=" + os.path.join(outdir, "cg.%p")]
        procs.append(subprocess.Popen(prefix + cmd, env=env, stdout=subprocess.PIPE, text=True))
    try:
        out = procs[0].communicate(timeout=args.timeout)[0]
        codes = [procs[0].returncode] + [p.wait(timeout=args.timeout) for p in procs[1:]]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(codes):
        sys.exit(f"overhead: backend {backend} failed (exit codes {codes})")
    if args.count:
        return read_counts(outdir, args.iterations, args.keep)
    return {a: float(b) for a, b in (line.split() for line in out.splitlines() if line.strip())}


REQUEST = "desc: Trigger: Client Request: "


def read_counts(outdir, iterations, keep):
    """{path: instructions per operation (average of its send and its recv, or its
    allreduce)} from the dumps callgrind wrote at each _C._callgrind("<path>-<pattern>")."""
    per = {}
    for name in os.listdir(outdir):
        trigger, total = None, None
        with open(os.path.join(outdir, name)) as f:
            for line in f:
                if line.startswith(REQUEST):
                    trigger = line[len(REQUEST):].strip()
                elif line.startswith(("summary:", "totals:")):
                    total = int(line.split()[1])
        if trigger and total is not None:
            path, _, pattern = trigger.rpartition("-")
            per.setdefault(path, {})[pattern] = total / iterations
        if not keep:
            os.unlink(os.path.join(outdir, name))
    if keep:
        print(f"# callgrind's files (callgrind_annotate FILE): {outdir}", file=sys.stderr)
    else:
        os.rmdir(outdir)
    return {p: sum(v.values()) / len(v) for p, v in per.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="shm,gloo,null", type=lambda s: s.split(","))
    ap.add_argument("--op", choices=("pingpong", "allreduce"), default="pingpong",
                    help="an 8-byte send/recv ping-pong (default) or an all_reduce (float32)")
    ap.add_argument("--size", type=int, default=8, help="bytes (default 8)")
    ap.add_argument("--iterations", type=int, default=20000)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                    help="--op allreduce: the tensor's dtype (default float32)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--count", action="store_true",
                    help="instructions per operation under callgrind instead of time")
    ap.add_argument("--keep", action="store_true",
                    help="with --count: keep callgrind's files and print where they are")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--backend", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return 0
    try:
        import torch  # noqa: F401
        import shmdist.torch  # noqa: F401
    except ImportError as e:
        print(f"overhead: cannot import torch and shmdist.torch ({e}); build the backend and "
              "set PYTHONPATH=<build>/python", file=sys.stderr)
        return 3
    if args.count and args.op == "allreduce":
        print(f"# {args.size}-byte {args.dtype} all_reduce on rank 0 of 2 under callgrind: "
              f"instructions per call, {args.iterations} calls")
    elif args.count:
        print(f"# {args.size}-byte send and recv on rank 0 under callgrind: instructions per "
              f"operation (mean of a send and a recv), {args.iterations} of each")
    elif args.op == "allreduce":
        print(f"# {args.size}-byte {args.dtype} all_reduce on 2 ranks, us per call, median of "
              f"{args.rounds} interleaved rounds of {args.iterations}")
    else:
        print(f"# {args.size}-byte ping-pong, half a round trip in us, median of {args.rounds} "
              f"interleaved rounds of {args.iterations}")
    print(f"{'# backend':<10}{'dist':>10}{'method':>10}{'c10d':>10}{'shmdist':>10}"
          f"{'py layer':>10}{'binding':>10}{'adapter':>10}{'over C++':>10}")
    figures = {}
    for backend in args.backends:
        f = figures[backend] = run_backend(args, backend)
        core = f.get("shmdist")
        row = [f["dist"], f["method"], f["c10d"], core, f["dist"] - f["method"],
               f["method"] - f["c10d"], None if core is None else f["c10d"] - core,
               f["dist"] - f["c10d"]]
        print(f"{backend:<10}" + "".join(f"{'-':>10}" if v is None else fmt(v, args) for v in row),
              flush=True)
    if "shm" in figures and "null" in figures:
        print(floor_lines(figures["shm"], figures["null"], args), end="")
    return 0


def fmt(v, args, width=10):
    return f"{v:>{width}.0f}" if args.count else f"{v:>{width}.3f}"


def floor_lines(shm, null, args):
    """What "shm" costs above the floor (backend "null", which does nothing)."""
    unit = "instructions" if args.count else "us"
    lines = [
        ("shm above the floor, from Python (dist)", shm["dist"] - null["dist"]),
        ("shm above the floor, in C++ (c10d)", shm["c10d"] - null["c10d"]),
        ("Python-level overhead over the C++ call, shm (dist - c10d)", shm["dist"] - shm["c10d"]),
        ("Python-level overhead over the C++ call, null: the floor", null["dist"] - null["c10d"]),
        ("shm's part of its Python-level overhead (the two above)",
         (shm["dist"] - shm["c10d"]) - (null["dist"] - null["c10d"])),
    ]
    return "".join(f"# {what:<62}{fmt(v, args)} {unit}\n" for what, v in lines)


if __name__ == "__main__":
    sys.exit(main())
