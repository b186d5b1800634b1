"""bench/compare's torch.distributed section: bench/torch/torch_bench.py (the same Python
loops over backend "shm" and backend "gloo", in one run), printed after the main report,
with its rows in <stem>-torch.csv; then bench/torch/overhead.py (where a call's time goes:
torch's Python layer, its bindings, the backend's adapter, shmdist's C++ call)."""
import os
import subprocess

from . import runner

SCRIPT = os.path.join(runner.BENCH_DIR, "torch", "torch_bench.py")
OVERHEAD = os.path.join(runner.BENCH_DIR, "torch", "overhead.py")


def options(quick):
    if quick:
        return ["--ranks", "2", "--max-size", str(1 << 20), "--iterations", "20", "--warmup", "2"]
    return []  # the script's defaults: 4 B to 16 MiB, 2 and 4 ranks


def overhead_options(quick):
    return ["--iterations", "2000", "--rounds", "2"] if quick else []


def _run(cmd, env, timeout, what):
    """(stdout, note): the output, or why it was skipped or failed."""
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "", "%s failed: no result within %d s" % (what, timeout)
    if out.returncode == 3:
        return "", "%s skipped: %s" % (what, out.stderr.strip())
    if out.returncode != 0:
        return out.stdout, "%s failed (exit %d): %s" % (what, out.returncode,
                                                       out.stderr.strip()[-500:])
    return out.stdout, ""


def run(build_dir, stem, quick, timeout):
    """Returns (text, note): the tables, or why the section was skipped or failed."""
    package = os.path.join(build_dir, "python")
    if not os.path.isdir(os.path.join(package, "shmdist")):
        return "", "torch section skipped: the shm backend is not built in %s" % build_dir
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in [package, os.environ.get("PYTHONPATH", "")] if p))
    cmd = [runner.SYSTEM_PYTHON, SCRIPT, "--csv", stem + "-torch.csv"] + options(quick)
    text, note = _run(cmd, env, timeout, "torch section")
    if note:
        return text, note
    text += "\nCSV: %s-torch.csv\n" % stem
    more, note = _run([runner.SYSTEM_PYTHON, OVERHEAD] + overhead_options(quick), env, timeout,
                      "torch overhead (bench/torch/overhead.py)")
    return text + "\n" + more, note
