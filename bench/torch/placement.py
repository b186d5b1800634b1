#!/usr/bin/python3
"""Where the scheduler puts two unbound ranks while they stream: runs a 2-rank 1 MiB bw job
(shmdist-bench under shmrun --bind-to none, or bench/torch/torch_bench.py --bind none over
"shm"), samples the CPU each rank runs on (/proc/PID/stat, field 39) every 0.5 ms, and
prints the bandwidth, the fraction of samples with both ranks on one CPU, and the ranks'
voluntary (sleeps: futex waits) and involuntary (preemptions, yields) context switches.

    PYTHONPATH=build/python /usr/bin/python3 bench/torch/placement.py [--job cxx|torch]
        [--build build] [--size 1048576] [--iterations 50] [--rounds 3] [VAR=VALUE ...]

VAR=VALUE pairs go into the job's environment (e.g. SHMDIST_SPIN_US=1000); with --rounds N
the variants given as --variant "A=1" --variant "B=2" run interleaved, N rounds. The sampler
itself takes a little CPU: compare variants within one run, not against other runs.
"""
import argparse
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def children(pid):
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry))
    return sorted(out)


def cpu_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[36])


def switches(pid):
    got = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if "ctxt_switches" in line:
                key, value = line.split(":")
                got[key.strip()] = int(value)
    return got


def command(args):
    size, it = str(args.size), str(args.iterations)
    if args.job == "cxx":
        b = os.path.join(ROOT, args.build)
        return [os.path.join(b, "launcher", "shmrun"), "-n", "2", "--bind-to", "none",
                os.path.join(b, "bench", "shmdist-bench"), "bw", "--min-size", size,
                "--max-size", size, "-i", it]
    return ["/usr/bin/python3", os.path.join(ROOT, "bench", "torch", "torch_bench.py"),
            "--backends", "shm", "--ranks", "2", "--tests", "bw", "--min-size", size,
            "--max-size", size, "--iterations", it, "--warmup", "2", "--bind", "none"]


def one(args, variant):
    env = dict(os.environ)
    for kv in variant:
        key, _, value = kv.partition("=")
        env[key] = value
    job = subprocess.Popen(command(args), env=env, stdout=subprocess.PIPE, text=True)
    ranks = []
    while len(ranks) < 2 and job.poll() is None:
        ranks = children(job.pid)
        time.sleep(0.001)
    same = total = 0
    last = {}
    while job.poll() is None and len(ranks) == 2:
        try:
            cpus = [cpu_of(r) for r in ranks]
            last = {r: switches(r) for r in ranks}
        except OSError:
            break
        total += 1
        same += cpus[0] == cpus[1]
        time.sleep(0.0005)
    out = job.communicate()[0]
    figures = [line.split()[1] for line in out.splitlines() if line[:1].isdigit()]
    vol = sum(v.get("voluntary_ctxt_switches", 0) for v in last.values())
    inv = sum(v.get("nonvoluntary_ctxt_switches", 0) for v in last.values())
    share = same / total if total else float("nan")
    print(f"{figures[-1] if figures else '-':>10} MB/s  one CPU {share:5.2f} ({same}/{total})  "
          f"voluntary {vol:>6}  involuntary {inv:>6}  {' '.join(variant) or 'default'}",
          flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", choices=("cxx", "torch"), default="cxx")
    ap.add_argument("--build", default="build")
    ap.add_argument("--size", type=int, default=1 << 20)
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--variant", action="append", default=[],
                    help="a space-separated list of VAR=VALUE; repeat for more variants")
    ap.add_argument("env", nargs="*", help="VAR=VALUE for every run")
    args = ap.parse_args()
    variants = [v.split() for v in args.variant] or [[]]
    for _ in range(args.rounds):
        for v in variants:
            one(args, args.env + v)
    return 0


if __name__ == "__main__":
    sys.exit(main())
