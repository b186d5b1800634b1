#!/usr/bin/python3
"""Runs many of torch's DistributedTest._DistTestBase tests through run_dist.py, in chunks, each
chunk in its own process session and bounded in time, and writes one line per test:
NAME<TAB>outcome<TAB>seconds<TAB>reason (outcome pass, skip, fail, error, xfail, xpass, or
timeout when the chunk's bound ended it; a chunk that ends early resumes after that test).

    PYTHONPATH=build/python /usr/bin/python3 tests/python/torch_suite/survey.py \\
        --backend gloo --out /tmp/gloo.tsv [--list FILE | --all] [--chunk 20] \\
        [--chunk-timeout 1200] [--test-timeout 120] [--start spawn|fork] [--as gloo]

--test-timeout is torch's own per-test bound (DISTRIBUTED_TESTS_DEFAULT_TIMEOUT). Lines
already in --out are kept and those tests not rerun, so an interrupted survey continues.
"""
import argparse
import os
import signal
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RUN_DIST = os.path.join(HERE, "run_dist.py")


def all_test_names(backend):
    """Every test of the suite, as run_dist.py's class has them (imported in a child so that
    this process does not import torch), with BACKEND=backend as the chunks have it."""
    code = ("import sys; sys.argv=[sys.argv[0]]; import run_dist; "
            "print('\\n'.join(sorted(n for n in dir(run_dist.TestDistBackendWithSpawn) "
            "if n.startswith('test'))))")
    env = dict(os.environ, BACKEND=backend,
               PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]))
    env.pop("CI", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True,
                         text=True, timeout=300)
    return out.stdout.split()


def names_from(path):
    """The names in a list file (gloo_passes.txt's format; its marks do not matter here)."""
    with open(path) as f:
        return [fields[0] for fields in (line.split("#", 1)[0].split() for line in f) if fields]


def done_in(path):
    done = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                fields = line.rstrip("\n").split("\t")
                if len(fields) >= 2:
                    done[fields[0]] = fields[1]
    return done


def run_chunk(names, args, results):
    """Runs names in one run_dist.py; returns the name the chunk's bound cut off, if any."""
    env = dict(os.environ, BACKEND=args.backend,
               DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=str(args.test_timeout))
    cmd = [sys.executable, RUN_DIST, "--world-size", str(args.world_size), "--results", results,
           "--start", args.start, *(["--as", args.as_backend] if args.as_backend else []),
           *("TestDistBackendWithSpawn." + n for n in names)]
    with open(args.log, "a") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            proc.wait(timeout=args.chunk_timeout)
            return None
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the chunk's session: run_dist and its ranks
            proc.wait()
    started = None
    with open(results) as f:
        for line in f:
            if line.startswith("start "):
                started = line.split()[1]
    return started


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--list")
    ap.add_argument("--all", action="store_true")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=20)
    ap.add_argument("--chunk-timeout", type=float, default=1200)
    ap.add_argument("--test-timeout", type=int, default=120)
    ap.add_argument("--start", choices=["spawn", "fork"], default="spawn",
                    help="how run_dist.py starts the ranks (spawn: torch's way)")
    ap.add_argument("--as", dest="as_backend",
                    help="with --backend shm: torch's test module decides as for this backend "
                         "(run_dist.py --as)")
    ap.add_argument("--log", help="the chunks' output (default: OUT.log)")
    ap.add_argument("names", nargs="*")
    args = ap.parse_args()
    args.log = args.log or args.out + ".log"
    names = args.names or (names_from(args.list) if args.list else all_test_names(args.backend))
    done = done_in(args.out)
    todo = [n for n in names if n not in done]
    raw = args.out + ".raw"
    while todo:
        chunk = todo[:args.chunk]
        if os.path.exists(raw):
            os.remove(raw)
        cut = run_chunk(chunk, args, raw)
        finished = done_in(raw)
        with open(args.out, "a") as out:
            for n in chunk:
                if n in finished:
                    with open(raw) as f:
                        out.writelines(l for l in f if l.split("\t", 1)[0] == n)
                elif n == cut:
                    out.write(f"{n}\ttimeout\t{args.chunk_timeout:.0f}\tchunk bound reached\n")
        ran = set(finished) | ({cut} if cut else set())
        if not ran & set(chunk):
            # Nothing recorded (run_dist.py failed before running any test): say so and stop.
            sys.exit(f"survey: no result for {chunk[0]}..{chunk[-1]}; see {args.log}")
        todo = [n for n in todo if n not in ran]
        print(f"survey: {len(done_in(args.out))} recorded, {len(todo)} to go", flush=True)
    if os.path.exists(raw):
        os.remove(raw)


if __name__ == "__main__":
    main()
