"""bench/compare's "deepspeed" section (issue 29): torch all_reduce over backend "shm" (as
dist.all_reduce, "shm", and as shmdist.torch.inference_all_reduce, "shm-direct") against
DeepSpeed's inference_all_reduce (its own shared-memory all_reduce, what CPU tensor-parallel
inference uses) and gloo, through bench/torch/allreduce_peers.py: the same torch loop, float32
and bfloat16, 4 KiB to 16 MiB, time per call. Configurations: 2 ranks bound one per core with
OMP_NUM_THREADS=1 (what torchrun sets), 2 ranks with torch's default thread count (unbound),
and 4 ranks on the 2 cores (OMP_NUM_THREADS=1, unbound). Every job (one backend, one
configuration, one round) is one gated run; the table takes the median over the rounds'
fast-state runs, as every other table does.

DeepSpeed comes from its own venv (scripts/install-deps --deepspeed makes .venv-deepspeed:
torch 2.13, deepspeed, ninja; or --deepspeed-python), which also runs "shm" (the backend built
for that torch, <build>/python-torch2.13) and gloo, so all three run on the same torch.
Standard library only."""
import os

from . import runner

SCRIPT = os.path.join(runner.BENCH_DIR, "torch", "allreduce_peers.py")
BACKENDS = ["shm", "shm-direct", "deepspeed", "gloo"]
DTYPES = ["float32", "bfloat16"]
# (ranks, label): "1" = OMP_NUM_THREADS=1, bound one per core when ranks <= CPUs;
# "default" = torch's default intra-op thread count, unbound; "1u" = OMP_NUM_THREADS=1,
# unbound, for shm and shm-direct only: "default" against "1u" differs in the thread count
# alone, "default" against "1" also in the binding.
CONFIGS = [(2, "1"), (2, "default"), (2, "1u"), (4, "1")]
UNBOUND_ONLY = ("shm", "shm-direct")  # the backends that run the "1u" configuration
TEST = "torch_allreduce"


def metric(dtype, threads):
    return "%s_us_omp%s" % (dtype, threads)


def options(quick):
    if quick:
        return ["--max-size", str(1 << 20), "--iterations", "20", "--warmup", "2"]
    return []  # the script's defaults: 4 KiB to 16 MiB, time-bounded iteration counts


def default_python():
    return os.environ.get("SHMDIST_DEEPSPEED_PYTHON") or \
        os.path.join(runner.REPO_DIR, ".venv-deepspeed", "bin", "python")


def find_interpreter(build_dir, explicit, want_deepspeed, notes, timeout=120):
    """(python, PYTHONPATH for shmdist, has DeepSpeed) or None, with a note saying why."""
    candidates = []
    if want_deepspeed:
        candidates.append((explicit or default_python(), True))
    candidates += [(os.path.join(runner.REPO_DIR, ".venv", "bin", "python"), False),
                   (runner.SYSTEM_PYTHON, False)]
    packages = sorted((os.path.join(build_dir, d) for d in os.listdir(build_dir)
                       if d.startswith("python")), reverse=True)  # python-torch2.13 first
    for python, deepspeed in candidates:
        if not os.path.isfile(python):
            if deepspeed:
                notes.append("deepspeed section: DeepSpeed skipped: %s does not exist "
                             "(scripts/install-deps --deepspeed makes it)" % python)
            continue
        if deepspeed:
            probe = runner.run([python, "-c", "import deepspeed, ninja"], timeout,
                               env=dict(os.environ, DS_ACCELERATOR="cpu"))
            if not probe.ok:
                notes.append("deepspeed section: DeepSpeed skipped: %s cannot import deepspeed "
                             "and ninja (%s)" % (python, probe.reason))
                continue
        for package in packages:
            probe = runner.run([python, "-c", "import shmdist.torch"], timeout,
                               env=dict(os.environ, PYTHONPATH=package))
            if probe.ok:
                return python, package, deepspeed
    notes.append("deepspeed section skipped: no interpreter found that imports torch and the "
                 "shm backend built in %s" % build_dir)
    return None


def run(session, rounds, quick, build_dir, explicit_python, want_deepspeed):
    found = find_interpreter(build_dir, explicit_python, want_deepspeed, session.tools.notes)
    if not found:
        return
    python, package, deepspeed = found
    backends = [b for b in BACKENDS if b != "deepspeed" or deepspeed]
    if not session.tools.gloo_script and "gloo" in backends:
        backends.remove("gloo")  # compare --no-gloo
    inner = max(5, session.timeout - 5)
    for rnd in range(rounds):
        for ranks, threads in CONFIGS:
            k = rnd % len(backends)
            for backend in backends[k:] + backends[:k]:
                if threads == "1u" and backend not in UNBOUND_ONLY:
                    continue
                cmd = ["/usr/bin/env", "PYTHONPATH=" + package, python, SCRIPT,
                       "--backends", backend, "--ranks", str(ranks),
                       "--threads", "1" if threads == "1u" else threads,
                       "--timeout", str(inner)] + (["--bind", "none"] if threads == "1u" else []) \
                    + options(quick)
                res = session.execute("torch all_reduce %s, %d ranks, %s (round %d)"
                                      % (backend, ranks, describe(threads), rnd + 1), cmd)
                for line in res.stdout.splitlines():
                    parts = line.split()
                    if len(parts) == 4 and parts[0] == backend and parts[1] in DTYPES:
                        session.record(rnd + 1, TEST, backend, ranks, int(parts[2]),
                                       metric(parts[1], threads), float(parts[3]), "us")


def text(report):
    """The section's tables: per configuration, each dtype and size with every backend's time
    and the others' time over shm's (above 1: shm is faster), and DeepSpeed's over
    shm-direct's; then default threads over
    OMP_NUM_THREADS=1 for each backend (at most 1: the default costs nothing)."""
    out = []
    have = [b for b in BACKENDS if any(r["test"] == TEST and r["transport"] == b
                                       for r in report.records)]
    if not have:
        return out
    ratios = [(b, "shm") for b in have if b != "shm"]
    if "deepspeed" in have and "shm-direct" in have:
        ratios.append(("deepspeed", "shm-direct"))
    for ranks, threads in CONFIGS:
        rows = [(d, s) for d in DTYPES for s in report.sizes(TEST, metric(d, threads))
                if any(r["ranks"] == ranks for r in report.records
                       if r["test"] == TEST and r["metric"] == metric(d, threads))]
        if not rows:
            continue
        out += ["", "torch all_reduce, %d ranks, %s: us per call (ratio = a / b: above 1 "
                "means b is faster; target against deepspeed at 2 ranks: at least 1.30, "
                "at 4 ranks: gloo at least 1)" % (ranks, describe(threads)),
                "%-10s%10s" % ("dtype", "size") + "".join("%12s" % b for b in have) +
                "".join("%*s" % (width(a, b), a + "/" + b) for a, b in ratios) + "   state"]
        for dtype, size in rows:
            m = metric(dtype, threads)
            vals = {b: report.value(TEST, b, m, size, ranks) for b in have}
            line = "%-10s%10s" % (dtype, human(size)) + "".join(fmt(vals[b], 12) for b in have)
            for a, b in ratios:
                ratio = vals[a] / vals[b] if vals.get(a) and vals.get(b) else None
                line += fmt(ratio, width(a, b), 2, "x")
            out.append(line + "   " + report.state(TEST, have, m, size, ranks))
    sizes = sorted({s for d in DTYPES for s in report.sizes(TEST, metric(d, "default"))})
    if sizes:
        out += ["", "torch all_reduce, 2 ranks: torch's default thread count over "
                "OMP_NUM_THREADS=1, per backend (at most 1: the default costs nothing; target "
                "for shm: at most 1); the default runs unbound, so the columns 'unbound' divide "
                "by OMP_NUM_THREADS=1 unbound too: the thread count alone",
                "%-10s%10s" % ("dtype", "size") + "".join("%12s" % b for b in have)
                + "".join("%20s" % (b + " unbound") for b in UNBOUND_ONLY if b in have)]
        for dtype in DTYPES:
            for size in sizes:
                line = "%-10s%10s" % (dtype, human(size))
                for b, over in [(b, "1") for b in have] + \
                        [(b, "1u") for b in UNBOUND_ONLY if b in have]:
                    a = report.value(TEST, b, metric(dtype, "default"), size, 2)
                    one = report.value(TEST, b, metric(dtype, over), size, 2)
                    line += fmt(a / one if a and one else None, 12 if over == "1" else 20, 2, "x")
                out.append(line)
    return out


def describe(threads):
    return {"1": "OMP_NUM_THREADS=1", "1u": "OMP_NUM_THREADS=1, unbound",
            "default": "torch's default thread count, unbound"}[threads]


def width(a, b):
    return max(14, len(a) + len(b) + 3)


def human(size):
    return "%d MiB" % (size >> 20) if size >= 1 << 20 else "%d KiB" % (size >> 10) \
        if size >= 1 << 10 else "%d B" % size


def fmt(v, width, digits=2, suffix=""):
    if v is None:
        return "-".rjust(width)
    return ("%.*f%s" % (digits, v, suffix)).rjust(width)
