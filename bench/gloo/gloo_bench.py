#!/usr/bin/python3
"""shmdist-bench's loops over torch.distributed with the gloo backend (TCP over 127.0.0.1).

    /usr/bin/python3 bench/gloo/gloo_bench.py [-n RANKS] [--min-size N] [--max-size N]
        [--iterations N] [--warmup N] [--window N] latency|bw|bibw|anysource
        | allreduce|bcast|reduce|allgather|reduce_scatter|alltoall

The script starts its own ranks (it is its own launcher) and prints the same OSU-style output
as shmdist-bench (bench/common/osu_loops.hpp holds the reference loops). Exits 3 with a
message, and prints nothing on stdout, when torch or its gloo backend is missing.
"""
import argparse
import datetime
import os
import socket
import subprocess
import sys
import time

VERSION = "0.1.0"  # keep in step with project(VERSION) in the top CMakeLists.txt
MAX_SIZE = 1 << 22
LARGE = 8192
DATA_TAG, REPLY_TAG, ACK_TAG, STOP_TAG = 100, 10, 101, 102


def sizes(args, default_min):
    lo = args.min_size if args.min_size is not None else default_min
    hi = args.max_size if args.max_size is not None else MAX_SIZE
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s = s * 2 if s else 1
    return out


def latency_loop(size, args):
    it, skip = (1000, 10) if size > LARGE else (10000, 100)
    return (args.iterations or it, skip if args.warmup is None else args.warmup)


def bandwidth_loop(size, args):
    it, skip = (20, 2) if size > LARGE else (100, 10)
    return (args.iterations or it, skip if args.warmup is None else args.warmup)


def title(test, torch):
    print("# gloo %s Test v%s (torch %s)" % (test, VERSION, torch.__version__))


def header(*columns):
    print(("%-*s" % (10, "# Size")) + "".join("%*s" % (20, c) for c in columns))


def row(size, *values):
    print(("%-*d" % (10, size)) + "".join("%*.*f" % (20, 2, v) for v in values), flush=True)


def run_latency(dist, torch, args, me):
    peer = 1 - me
    if me == 0:
        title("Latency", torch)
        header("Latency (us)")
    for size in sizes(args, 0):
        iters, skip = latency_loop(size, args)
        s = torch.full((size,), me + 1, dtype=torch.uint8)
        r = torch.zeros(size, dtype=torch.uint8)
        dist.barrier()
        start = 0.0
        for i in range(iters + skip):
            if i == skip:
                start = time.perf_counter()
            if me == 0:
                dist.send(s, peer, tag=DATA_TAG)
                dist.recv(r, peer, tag=DATA_TAG)
            else:
                dist.recv(r, peer, tag=DATA_TAG)
                dist.send(s, peer, tag=DATA_TAG)
        elapsed = time.perf_counter() - start
        if me == 0:
            row(size, elapsed * 1e6 / (2.0 * iters))


def run_bandwidth(dist, torch, args, me):
    peer = 1 - me
    ack = torch.zeros(4, dtype=torch.uint8)
    if me == 0:
        title("Bandwidth", torch)
        header("Bandwidth (MB/s)")
    for size in sizes(args, 1):
        iters, skip = bandwidth_loop(size, args)
        buf = torch.full((size,), me + 1, dtype=torch.uint8)
        dist.barrier()
        start = 0.0
        for i in range(iters + skip):
            if i == skip:
                start = time.perf_counter()
            if me == 0:
                reqs = [dist.isend(buf, peer, tag=DATA_TAG) for _ in range(args.window)]
                for q in reqs:
                    q.wait()
                dist.recv(ack, peer, tag=ACK_TAG)
            else:
                reqs = [dist.irecv(buf, peer, tag=DATA_TAG) for _ in range(args.window)]
                for q in reqs:
                    q.wait()
                dist.send(ack, peer, tag=ACK_TAG)
        elapsed = time.perf_counter() - start
        if me == 0:
            row(size, size / 1e6 * iters * args.window / elapsed)


def run_bibandwidth(dist, torch, args, me):
    peer = 1 - me
    out_tag, in_tag = (DATA_TAG, REPLY_TAG) if me == 0 else (REPLY_TAG, DATA_TAG)
    if me == 0:
        title("Bi-Directional Bandwidth", torch)
        header("Bandwidth (MB/s)")
    for size in sizes(args, 1):
        iters, skip = bandwidth_loop(size, args)
        s = torch.full((size,), me + 1, dtype=torch.uint8)
        r = torch.zeros(size, dtype=torch.uint8)
        dist.barrier()
        start = 0.0
        for i in range(iters + skip):
            if i == skip:
                start = time.perf_counter()
            recvs = [dist.irecv(r, peer, tag=in_tag) for _ in range(args.window)]
            sends = [dist.isend(s, peer, tag=out_tag) for _ in range(args.window)]
            for q in sends + recvs:
                q.wait()
        elapsed = time.perf_counter() - start
        if me == 0:
            row(size, size / 1e6 * iters * args.window * 2.0 / elapsed)


def run_anysource(dist, torch, args, me, world):
    """Latency only: rank 0 receives with src=None from rank 1 while the others wait."""
    stop = torch.zeros(4, dtype=torch.uint8)
    all_sizes = sizes(args, 0)
    results = []
    dist.barrier()
    if me >= 2:
        dist.recv(stop, 0, tag=STOP_TAG)
    else:
        for size in all_sizes:
            iters, skip = latency_loop(size, args)
            s = torch.full((size,), me + 1, dtype=torch.uint8)
            r = torch.zeros(size, dtype=torch.uint8)
            start = 0.0
            for i in range(iters + skip):
                if me == 0:
                    if i == skip:
                        start = time.perf_counter()
                    dist.send(s, 1, tag=DATA_TAG)
                    src = dist.recv(r, None, tag=DATA_TAG)
                    if src != 1:
                        raise RuntimeError("any-source reply came from rank %s" % src)
                else:
                    dist.recv(r, 0, tag=DATA_TAG)
                    dist.send(s, 0, tag=DATA_TAG)
            results.append((size, (time.perf_counter() - start) * 1e6 / (2.0 * iters)))
        if me == 0:
            for idle in range(2, world):
                dist.send(stop, idle, tag=STOP_TAG)
    if me == 0:
        title("Any-Source", torch)
        print("# [ ranks: %d ] [ senders: %d ] [ latency: rank 1 active, %d idle ]"
              % (world, world - 1, world - 2))
        header("Latency (us)")
        for size, lat in results:
            row(size, lat)


COLLECTIVES = {
    "allreduce": "Allreduce Latency", "bcast": "Broadcast Latency", "reduce": "Reduce Latency",
    "allgather": "Allgather Latency", "reduce_scatter": "Reduce_scatter Latency",
    "alltoall": "All-to-All Latency",
}


def run_collective(dist, torch, args, me, world):
    """bench/common/osu_collectives.hpp's loop: float32, each call timed alone and followed by
    a barrier, average us per call across ranks. Sizes as there (allgather: each rank's part;
    alltoall: each pair's; reduce_scatter: each rank's whole input). gloo in torch 1.13 has no
    reduce_scatter: that test prints a comment and no rows."""
    test = args.test
    if me == 0:
        title(COLLECTIVES[test], torch)
        print("# [ ranks: %d ] [ float32; average time per call across ranks ]" % world)
        header("Avg Latency(us)")
    if test == "reduce_scatter":
        if me == 0:
            print("# reduce_scatter: not supported by the gloo backend of torch %s"
                  % torch.__version__)
        return
    lo = args.min_size if args.min_size is not None else 4
    hi = args.max_size if args.max_size is not None else 16 << 20
    size = lo
    while size <= hi:
        e = max(size // 4, 1)
        x = torch.ones(e, dtype=torch.float32)
        if test == "allgather":
            outs = [torch.zeros(e) for _ in range(world)]
            call = lambda: dist.all_gather(outs, x)
        elif test == "alltoall":
            inp, out = torch.ones(e * world), torch.zeros(e * world)
            call = lambda: dist.all_to_all_single(out, inp)
        elif test == "bcast":
            call = lambda: dist.broadcast(x, 0)
        elif test == "reduce":
            call = lambda: dist.reduce(x, 0)
        else:
            call = lambda: dist.all_reduce(x)
        iters, skip = (100, 10) if size > LARGE else (1000, 200)
        iters = args.iterations or iters
        skip = skip if args.warmup is None else args.warmup
        total = 0.0
        dist.barrier()
        for i in range(skip + iters):
            t0 = time.perf_counter()
            call()
            t = time.perf_counter() - t0
            if i >= skip:
                total += t
            dist.barrier()
        avg = torch.tensor([total * 1e6 / iters], dtype=torch.float64)
        dist.all_reduce(avg)
        if me == 0:
            row(size, avg.item() / world)
        size *= 2


def rank_main(args):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % args.port,
                            rank=args.rank, world_size=args.nproc,
                            timeout=datetime.timedelta(seconds=args.timeout))
    me = dist.get_rank()
    if args.test in ("latency", "bw", "bibw") and args.nproc != 2:
        raise SystemExit("gloo_bench: %s needs exactly 2 ranks" % args.test)
    if args.test == "latency":
        run_latency(dist, torch, args, me)
    elif args.test == "bw":
        run_bandwidth(dist, torch, args, me)
    elif args.test == "bibw":
        run_bibandwidth(dist, torch, args, me)
    elif args.test in COLLECTIVES:
        run_collective(dist, torch, args, me, args.nproc)
    else:
        run_anysource(dist, torch, args, me, args.nproc)
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args):
    try:
        import torch.distributed as dist
        if not dist.is_available() or not dist.is_gloo_available():
            raise ImportError("torch.distributed without gloo")
    except ImportError as e:
        print("gloo_bench: torch with gloo is not importable (%s)" % e, file=sys.stderr)
        return 3
    port = free_port()
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    argv = [sys.executable, os.path.abspath(__file__)] + sys.argv[1:]
    procs = [subprocess.Popen(argv + ["--rank", str(r), "--port", str(port)], env=env)
             for r in range(args.nproc)]
    deadline = time.monotonic() + args.timeout
    status = 0
    try:
        while procs:
            for p in list(procs):
                rc = p.poll()
                if rc is None:
                    continue
                procs.remove(p)
                if rc != 0 and status == 0:
                    status = rc if rc > 0 else 128 - rc
                    raise RuntimeError("a rank exited with %d" % rc)
            if time.monotonic() > deadline:
                status = 124
                raise RuntimeError("timed out after %d s" % args.timeout)
            time.sleep(0.02)
    except (RuntimeError, KeyboardInterrupt) as e:
        print("gloo_bench: %s; stopping the other ranks" % e, file=sys.stderr)
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
        return status or 1
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("test", choices=["latency", "bw", "bibw", "anysource"] + list(COLLECTIVES))
    ap.add_argument("-n", "--nproc", type=int, default=2)
    ap.add_argument("--min-size", type=int)
    ap.add_argument("--max-size", type=int)
    ap.add_argument("-i", "--iterations", type=int)
    ap.add_argument("-x", "--warmup", type=int)
    ap.add_argument("-W", "--window", type=int, default=64)
    ap.add_argument("--timeout", type=int, default=600, help="whole-run limit, seconds")
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank is None:
        sys.exit(launch(args))
    rank_main(args)


if __name__ == "__main__":
    main()
