#!/usr/bin/python3
"""torch all_reduce over backend "shm" (dist.all_reduce and shmdist.torch.inference_all_reduce),
DeepSpeed's inference_all_reduce and gloo: the same
torch loop, one job per backend, float32 and bfloat16, 4 KiB to 16 MiB, time per call.

    PYTHONPATH=build/python-torch2.13 .venv-deepspeed/bin/python bench/torch/allreduce_peers.py
        [--backends shm,shm-direct,deepspeed,gloo] [--ranks 2] [--threads 1|default] [--rounds 1]
        [--dtypes float32,bfloat16] [--min-size 4096] [--max-size 16777216] [--budget 0.3]
        [--iterations N] [--warmup N] [--bind core|none] [--timeout 600] [--skip-missing]

bench/compare runs it once per backend, thread setting, rank count and round, gated on the
floor probe (its "allreduce-peers" section, comparelib/peers_section.py), and prints the
table; run by hand with several backends it prints the same table itself (median over
--rounds jobs per backend, the backends' order rotating between rounds).

Every rank runs, at each dtype and size: one checked call (every rank's tensor filled with
rank + 1, every element of the result must be 1 + 2 + ... + ranks, exact in bfloat16 too),
then warm-up calls that estimate one call's time, then a timed loop of --budget seconds'
worth of calls (at least 5, at most 2,000 up to 64 KiB and 200 above; --iterations N runs
exactly N) over a tensor of zeros; the figure is the mean time per call over the ranks. The
ranks agree on the iteration count through an all_reduce MAX of their estimates (on the
backend under test; for DeepSpeed that is its torch group, gloo), outside the timed loop.

  shm        dist.all_reduce(t) on backend "shm" (import shmdist.torch)
  shm-direct shmdist.torch.inference_all_reduce(t) on backend "shm": the same collective
             without torch.distributed's Python layer and dispatcher (docs/torch.md "Direct
             all_reduce"), as DeepSpeed's call skips them
  deepspeed  deepspeed.comm.inference_all_reduce(t) after deepspeed.init_distributed("gloo"),
             DS_ACCELERATOR=cpu, LOCAL_SIZE = ranks (DeepSpeed uses its shared-memory kernel
             only when every rank is local, and only where the CPU has AVX2 for float32 and
             AVX-512BW for bfloat16; the script refuses to report a run that fell back to
             gloo). Its kernel builds with ninja on first use (~/.cache/torch_extensions).
  gloo       dist.all_reduce(t) on backend "gloo"

--threads 1 sets OMP_NUM_THREADS=1 (what torchrun sets); --threads default leaves it unset,
so torch takes its default intra-op thread count (printed). With --bind core (the default)
and no more ranks than CPUs, rank r runs on CPU r, but only with --threads 1: a rank bound
to one CPU gets one thread by default, which would hide what the default costs.

Output: '#' comments, then one row per figure: backend dtype size_bytes us_per_call; the
table's ratios are each other backend's time over shm's, and DeepSpeed's over shm-direct's. Exits 3
(nothing on stdout) when torch, shmdist.torch or (without --skip-missing) deepspeed cannot
be imported.
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import time

BACKENDS = ("shm", "shm-direct", "deepspeed", "gloo")
DTYPES = ("float32", "bfloat16")
LARGE = 65536
MIN_TIMED = 5


def sizes(lo, hi):
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= 2
    return out


# ---- one rank --------------------------------------------------------------------------

def worker(args):
    me_env, world_env = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cpus = sorted(os.sched_getaffinity(0))
    pinned = bound(args, world_env)
    if pinned:
        os.sched_setaffinity(0, {cpus[me_env]})
    import torch
    import torch.distributed as dist
    if args.backend == "deepspeed":
        import deepspeed
        import deepspeed.comm as dscomm
        deepspeed.init_distributed(dist_backend="gloo", verbose=False)
        cdb = dscomm.comm.cdb
        level = getattr(cdb, "shm_vector_kernel_level", 0) if cdb.shm_comm_op else -1
        op = dscomm.inference_all_reduce
    else:
        if args.backend.startswith("shm"):
            import shmdist.torch
        dist.init_process_group(backend="shm" if args.backend.startswith("shm") else args.backend)
        level = None
        op = shmdist.torch.inference_all_reduce if args.backend == "shm-direct" else dist.all_reduce
    me, world = dist.get_rank(), dist.get_world_size()
    if me == 0:
        print(f"# {args.backend}: torch {torch.__version__}, {torch.get_num_threads()} intra-op "
              f"threads per rank, {'bound one per CPU' if pinned else 'unbound'}"
              + ("" if level is None else f", DeepSpeed {deepspeed.__version__} shm kernel "
                 f"level {level}"), flush=True)
    for name in args.dtypes:
        dtype = getattr(torch, name)
        if level is not None and level < (1 if name == "float32" else 2):
            # inference_all_reduce would quietly run gloo's all_reduce instead.
            sys.exit(f"allreduce_peers: DeepSpeed's shared-memory all_reduce is not available "
                     f"for {name} on this machine (kernel level {level}; it needs AVX2 for "
                     f"float32, AVX-512BW for bfloat16): it would fall back to gloo")
        if args.backend == "gloo" and dtype == torch.bfloat16 and \
                int(torch.__version__.split(".")[0]) < 2:
            if me == 0:
                print(f"# gloo: no bfloat16 all_reduce in torch {torch.__version__}", flush=True)
            continue
        for size in sizes(args.min_size, args.max_size):
            n = max(1, size // torch.tensor([], dtype=dtype).element_size())
            check(op, torch, dtype, n, me, world, args.backend, size)
            t = torch.zeros(n, dtype=dtype)
            most, skip = (200, 10) if size > LARGE else (2000, 50)
            most, skip = args.iterations or most, skip if args.warmup is None else args.warmup

            def step():
                op(t)
            dist.barrier()
            iters = most if args.iterations else calibrate(dist, torch, step, most, skip, args)
            start = 0.0
            warm = skip if args.iterations else 0
            for i in range(iters + warm):
                if i == warm:
                    start = time.perf_counter()
                step()
            per_call = (time.perf_counter() - start) * 1e6 / iters
            f = torch.tensor([per_call], dtype=torch.float64)
            dist.all_reduce(f)
            if me == 0:
                print(f"{args.backend} {name} {size} {f.item() / world:.3f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def bound(args, world):
    return args.bind == "core" and args.threads == "1" and world <= len(os.sched_getaffinity(0))


def check(op, torch, dtype, n, me, world, backend, size):
    t = torch.full((n,), me + 1, dtype=dtype)
    op(t)
    want = world * (world + 1) // 2
    if not bool((t == want).all()):
        bad = int((t != want).nonzero()[0])
        sys.exit(f"allreduce_peers: {backend} {dtype} {size} B on rank {me}: element {bad} is "
                 f"{t[bad].item()}, expected {want}")


def calibrate(dist, torch, step, most, skip, args):
    """The timed loop's iteration count, the same on every rank (as torch_bench.py's)."""
    def slowest(seconds):
        x = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
        return x.item()

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


# ---- the driver ------------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_backend(args, backend):
    """Runs one job; returns (comment lines, {(dtype, size): us}) from rank 0."""
    port = str(free_port())
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--backend", backend,
           "--threads", args.threads, "--bind", args.bind, "--dtypes", ",".join(args.dtypes),
           "--min-size", str(args.min_size), "--max-size", str(args.max_size),
           "--budget", str(args.budget)]
    if args.iterations:
        cmd += ["--iterations", str(args.iterations)]
    if args.warmup is not None:
        cmd += ["--warmup", str(args.warmup)]
    procs = []
    try:
        for r in range(args.ranks):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(args.ranks), LOCAL_RANK=str(r),
                       LOCAL_SIZE=str(args.ranks), MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                       DS_ACCELERATOR="cpu")
            if args.threads == "1":
                env["OMP_NUM_THREADS"] = "1"
            else:
                env.pop("OMP_NUM_THREADS", None)
            for k in ("SHMDIST_SEGMENT_FD", "SHMDIST_SEGMENT", "SHMDIST_JOB_KEY"):
                env.pop(k, None)
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True,
                                          stderr=None if r == 0 else subprocess.DEVNULL))
        out = procs[0].communicate(timeout=args.timeout)[0]
        codes = [procs[0].returncode] + [p.wait(timeout=args.timeout) for p in procs[1:]]
    finally:
        for p in procs:  # after a timeout or an interrupt: no rank outlives the driver
            if p.poll() is None:
                p.kill()
                p.wait()
        if backend == "deepspeed":
            remove_deepspeed_buffers(port)
    if any(codes):
        sys.exit(f"allreduce_peers: {backend} on {args.ranks} ranks failed (exit codes {codes})")
    comments, rows = [], {}
    for line in out.splitlines():
        if line.startswith("#"):
            comments.append(line)
        elif len(line.split()) == 4 and line.split()[:1] == [backend]:
            # (DeepSpeed prints lines of its own, such as its kernel's "built successfully")
            _b, dtype, size, us = line.split()
            rows[(dtype, int(size))] = float(us)
    return comments, rows


def remove_deepspeed_buffers(port):
    """DeepSpeed's shared-memory all_reduce leaves its buffers in /dev/shm
    (deepspeed_allreduce_buffer_<n>_<MASTER_ADDR>_<MASTER_PORT>_<rank>, never unlinked):
    removes those of the job that used this port, and no others."""
    suffix = f"_127.0.0.1_{port}_"
    try:
        names = os.listdir("/dev/shm")
    except OSError:
        return
    for name in names:
        if name.startswith("deepspeed_allreduce_buffer_") and suffix in name:
            try:
                os.unlink(os.path.join("/dev/shm", name))
            except OSError:
                pass


def importable(module):
    probe = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True,
                           text=True, env=dict(os.environ, DS_ACCELERATOR="cpu"))
    return probe.returncode == 0, probe.stderr.strip().splitlines()[-1:] or [""]


def driver(args):
    shm = any(b.startswith("shm") for b in args.backends)
    for module in ["torch", "shmdist.torch"] if shm else ["torch"]:
        ok, why = importable(module)
        if not ok:
            print(f"allreduce_peers: cannot import {module} with {sys.executable} ({why[0]}); "
                  "build the backend for this interpreter's torch and set "
                  "PYTHONPATH=<build>/python-torch<version>", file=sys.stderr)
            return 3
    if "deepspeed" in args.backends:
        ok, why = importable("deepspeed")
        if not ok and not args.skip_missing:
            print(f"allreduce_peers: cannot import deepspeed with {sys.executable} ({why[0]}); "
                  "scripts/install-deps --deepspeed makes .venv-deepspeed with it",
                  file=sys.stderr)
            return 3
        if not ok:
            print(f"# deepspeed skipped: not importable by {sys.executable}")
            args.backends = [b for b in args.backends if b != "deepspeed"]
    print(f"# all_reduce (SUM) on {args.ranks} ranks, time per call in us, "
          f"OMP_NUM_THREADS={'1' if args.threads == '1' else 'unset (torch default)'}, "
          f"median of {args.rounds} job(s) per backend")
    figures = {b: {} for b in args.backends}
    for rnd in range(args.rounds):
        k = rnd % len(args.backends)
        for backend in args.backends[k:] + args.backends[:k]:
            comments, rows = run_backend(args, backend)
            if rnd == 0:
                print("\n".join(comments), flush=True)
            for key, us in rows.items():
                figures[backend].setdefault(key, []).append(us)
    for backend in args.backends:
        for (dtype, size), vals in sorted(figures[backend].items()):
            print(f"{backend} {dtype} {size} {statistics.median(vals):.3f}", flush=True)
    print("\n" + table({b: {k: statistics.median(v) for k, v in f.items()}
                        for b, f in figures.items()}), end="")
    return 0


def table(figures):
    """Side by side: {backend: {(dtype, size): us}} -> one row per dtype and size, with each
    other backend's time over shm's (above 1: shm is faster) and DeepSpeed's over
    shm-direct's."""
    backends = [b for b in BACKENDS if b in figures]
    ratios = [(b, "shm") for b in backends if b != "shm" and "shm" in figures]
    if "deepspeed" in figures and "shm-direct" in figures:
        ratios.append(("deepspeed", "shm-direct"))
    keys = sorted({k for f in figures.values() for k in f}, key=lambda k: (k[0] != "float32", k))
    head = f"{'# dtype':<10}{'size':>10}" + "".join(f"{b + ' us':>14}" for b in backends)
    head += "".join(f"{a + '/' + b:>{width(a, b)}}" for a, b in ratios)
    lines = [head]
    for dtype, size in keys:
        vals = [figures[b].get((dtype, size)) for b in backends]
        line = f"{dtype:<10}{human(size):>10}" + "".join(
            f"{'-':>14}" if v is None else f"{v:>14.2f}" for v in vals)
        for a, b in ratios:
            v, base = figures[a].get((dtype, size)), figures[b].get((dtype, size))
            w = width(a, b)
            line += f"{'-':>{w}}" if not v or not base else f"{v / base:>{w - 1}.2f}x"
        lines.append(line)
    return "\n".join(lines) + "\n"


def width(a, b):
    return max(14, len(a) + len(b) + 3)


def human(size):
    return f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default=",".join(BACKENDS), type=lambda s: s.split(","))
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--threads", choices=("1", "default"), default="1")
    ap.add_argument("--rounds", type=int, default=1, help="jobs per backend (median)")
    ap.add_argument("--dtypes", default=",".join(DTYPES), type=lambda s: s.split(","))
    ap.add_argument("--min-size", type=int, default=4096)
    ap.add_argument("--max-size", type=int, default=16 << 20)
    ap.add_argument("--budget", type=float, default=0.3,
                    help="seconds of timed calls per size, dtype and backend (default 0.3)")
    ap.add_argument("--iterations", type=int, default=0,
                    help="exactly this many timed calls at every size (no time bound)")
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--bind", choices=("core", "none"), default="core")
    ap.add_argument("--timeout", type=float, default=600, help="seconds, per job")
    ap.add_argument("--skip-missing", action="store_true",
                    help="leave DeepSpeed out (with a note) when it is not installed")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--backend", help=argparse.SUPPRESS)
    args = ap.parse_args()
    for b in args.backends:
        if b not in BACKENDS:
            ap.error(f"unknown backend {b!r}; expected some of {','.join(BACKENDS)}")
    for d in args.dtypes:
        if d not in DTYPES:
            ap.error(f"unknown dtype {d!r}; expected some of {','.join(DTYPES)}")
    if args.ranks < 2 or args.rounds < 1:
        ap.error("--ranks must be at least 2 and --rounds at least 1")
    if args.worker:
        worker(args)
        return 0
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
