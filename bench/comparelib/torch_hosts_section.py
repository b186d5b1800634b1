"""bench/compare's sections of issue 30's figures, on 2 emulated hosts x 2 ranks:

torch-hosts: torch all_reduce (float32 SUM, 4 B to 16 MiB) and a DistributedDataParallel step
over backend "shm" (shm inside each host, gloo between hosts; python/shmdist/_hosts/)
against pure gloo, each host a private mount namespace with its own /dev/shm
(tests/python/emulated_hosts.py, as tests/python/test_hosts.py runs them), through
bench/torch/hosts_bench.py; under every torch that imports the backend built in the tree
(torch 2.13 from .venv with <build>/python-torch2.13, torch 1.13 from /usr/bin/python3 with
<build>/python).

mpi-hosts: the C++ path under mpirun: shmdist-bench allreduce on 2 emulated hosts x 2 ranks
(SHMDIST_HOST_ID per rank through tests/mpi/with_host_id.sh, as section hosts does) against
shmdist-mpi-bench allreduce (raw Open MPI), both with Open MPI on its TCP btl over loopback.

Every job (one backend, one test, one round) is one gated run, the order rotating between
rounds; the tables take the median over the rounds' fast-state runs, as every other table
does. Standard library only."""
import os

from . import hosts_section
from . import runner

SCRIPT = os.path.join(runner.BENCH_DIR, "torch", "hosts_bench.py")
BACKENDS = ["shm", "gloo"]
ALLREDUCE, DDP, MPI_ALLREDUCE = "torch_hosts_allreduce", "torch_hosts_ddp", "xhost_allreduce"
WIDTHS = [64, 2048]  # gradients of 50 KiB and 48 MiB
HOSTS = "a,a,b,b"  # section mpi-hosts: ranks 0, 1 on host a, 2, 3 on host b
SHARED = "-shared"  # the label's suffix for runs whose hosts share every CPU (--cpus shared)


def _where(label):
    """How a label's runs placed the emulated hosts on this machine's CPUs."""
    return ("every rank on every CPU" if label.endswith(SHARED) else
            "each host on CPUs of its own")


def interpreters(build_dir, notes, timeout=120):
    """[(torch label, python, PYTHONPATH)] for each torch that imports the backend built here."""
    found = []
    for python, package in ((os.path.join(runner.REPO_DIR, ".venv", "bin", "python"),
                             os.path.join(build_dir, "python-torch2.13")),
                            (runner.SYSTEM_PYTHON, os.path.join(build_dir, "python"))):
        if not os.path.isfile(python) or not os.path.isdir(package):
            continue
        probe = runner.run([python, "-c", "import torch, shmdist.torch; "
                            "print(torch.__version__.split('+')[0])"], timeout,
                           env=dict(os.environ, PYTHONPATH=package))
        if probe.ok:
            found.append(("torch" + ".".join(probe.stdout.strip().split(".")[:2]), python,
                          package))
    if not found:
        notes.append("torch-hosts section skipped: no interpreter imports torch and the shm "
                     "backend built in %s" % build_dir)
    return found


def options(quick):
    if quick:
        return {"allreduce": ["--max-size", str(1 << 20), "--iterations", "20", "--warmup",
                              "2"],
                "ddp": ["--steps", "12"], "widths": [512]}
    return {"allreduce": [], "ddp": [], "widths": WIDTHS}  # the script's defaults: 4 B-16 MiB


def run(session, rounds, quick, build_dir, releases, cpu_modes=("per-host",)):
    """`releases`: the torch releases to run ("2.13", "1.13"), of those found; one with
    --quick. `cpu_modes`: "per-host" (each emulated host's ranks on CPUs of its own, as on
    separate machines) and/or "shared" (every rank on every CPU); hosts_bench.py --cpus. A
    shared run's figures carry the label's suffix SHARED."""
    found = [f for f in interpreters(build_dir, session.tools.notes)
             if f[0][len("torch"):] in releases]
    if quick:
        found = found[:1]
    opts = options(quick)
    inner = max(5, session.timeout - 5)
    for rnd in range(rounds):
        for cpus in cpu_modes:
            for release, python, package in found:
                label = release + (SHARED if cpus == "shared" else "")
                jobs = [("allreduce", None)] + [("ddp", w) for w in opts["widths"]]
                for test, width in jobs:
                    k = rnd % len(BACKENDS)
                    for backend in BACKENDS[k:] + BACKENDS[:k]:
                        cmd = ["/usr/bin/env", "PYTHONPATH=" + package, python, SCRIPT, test,
                               "--backend", backend, "--timeout", str(inner),
                               "--cpus", cpus] + opts[test]
                        if width:
                            cmd += ["--width", str(width)]
                        what = "torch-hosts %s %s %s%s (round %d)" % (
                            label, test, backend, " width %d" % width if width else "",
                            rnd + 1)
                        res = session.execute(what, cmd)
                        record(session, rnd + 1, label, res.stdout)


def record(session, rnd, label, stdout):
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == "allreduce":
            session.record(rnd, ALLREDUCE, parts[1], 4, int(parts[2]), "us_" + label,
                           float(parts[3]), "us")
        elif len(parts) == 5 and parts[0] == "ddp":
            session.record(rnd, DDP, parts[1], 4, int(parts[2]), "ms_" + label,
                           float(parts[3]), "ms")
            session.record(rnd, DDP, parts[1], 4, int(parts[2]), "params", int(parts[4]),
                           "")


def mpi_options(quick):
    if quick:
        return {"max-size": 1 << 20, "iterations": 20, "warmup": 2}
    return {"iterations": 100, "warmup": 10}  # 4 B to 16 MiB (the collectives' default)


def run_mpi(session, rounds, quick):
    tools = session.tools
    if not tools.mpi_bench:
        session.log("mpi-hosts skipped: no Open MPI (see the notes)")
        return
    runs = [("shmdist", HOSTS), ("ompi-tcp", None)]
    bind = session.args.bind == "core"
    for rnd in range(rounds):
        for transport, hosts in runs[rnd % 2:] + runs[:rnd % 2]:
            res = session.execute("mpi-hosts allreduce %s (round %d)" % (transport, rnd + 1),
                                  hosts_section.command(tools, "allreduce", transport, hosts,
                                                        mpi_options(quick), bind, nproc=4))
            for size, vals in sorted(runner.parse_rows(res.stdout).items()):
                if vals:
                    session.record(rnd + 1, MPI_ALLREDUCE, transport, 4, size, "latency_us",
                                   vals[0], "us")


def text(report):
    """The sections' tables: time per call (or step) of each side and the ratio of the peer's
    time over shmdist's (above 1: shmdist is faster; the target is at least 1 everywhere)."""
    out = []
    labels = sorted({r["metric"][3:] for r in report.records if r["test"] == ALLREDUCE},
                    reverse=True)  # torch2.13 first
    for label in labels:
        m = "us_" + label
        out += ["", "torch all_reduce float32 on 2 emulated hosts x 2 ranks (%s), %s: us per "
                "call (gloo/shm above 1: shm is faster; target: at least 1 at every size)" % (
                    _where(label), label.replace(SHARED, "")),
                "%-22s%12s%12s%10s   state" % ("size", "shm", "gloo", "gloo/shm")]
        out += _rows(report, ALLREDUCE, m, "shm", "gloo", lambda s: str(s))
    labels = sorted({r["metric"][3:] for r in report.records
                     if r["test"] == DDP and r["metric"].startswith("ms_")}, reverse=True)
    for label in labels:
        m = "ms_" + label
        out += ["", "DDP step (3 Linear+Tanh of WIDTH, batch 16; forward, backward with the "
                "gradient all-reduce, SGD) on 2 emulated hosts x 2 ranks (%s), %s: ms per step "
                "of rank 0 (gloo/shm above 1: shm is faster)" % (_where(label),
                                                                  label.replace(SHARED, "")),
                "%-22s%12s%12s%10s   state" % ("width", "shm", "gloo", "gloo/shm")]
        out += _rows(report, DDP, m, "shm", "gloo", lambda w: "%d (%s)" % (
            w, _params(report, w)))
    if any(r["test"] == MPI_ALLREDUCE for r in report.records):
        out += ["", "C++ allreduce (shmdist-bench / shmdist-mpi-bench, float32) under mpirun on "
                "2 emulated hosts x 2 ranks, Open MPI's TCP btl over loopback: us per call "
                "(ompi/shmdist above 1: shmdist is faster)",
                "%-22s%12s%12s%12s   state" % ("size", "shmdist", "ompi-tcp", "ompi/shmdist")]
        out += _rows(report, MPI_ALLREDUCE, "latency_us", "shmdist", "ompi-tcp", str, 12)
    return out


def _params(report, width):
    vals = [r["value"] for r in report.records if r["test"] == DDP and r["size"] == width
            and r["metric"] == "params"]
    return "%d params" % vals[0] if vals else "?"


def _rows(report, test, metric, mine, theirs, name, ratio_width=10):
    out, slower = [], []
    for size in report.sizes(test, metric):
        a = report.value(test, mine, metric, size)
        b = report.value(test, theirs, metric, size)
        ratio = b / a if a and b else None
        if ratio is not None and ratio < 1:
            slower.append(name(size))
        out.append("%-22s%s%s%s   %s" % (name(size), _fmt(a, 12), _fmt(b, 12),
                                        _fmt(ratio, ratio_width, 2),
                                        report.state(test, [mine, theirs], metric, size)))
    out.append("%s slower than %s at: %s" % (mine, theirs, ", ".join(slower) or "no size"))
    return out


def _fmt(v, width, digits=2):
    return ("%*.*f" % (width, digits, v)) if v is not None else "-".rjust(width)
