"""bench/compare's torch.distributed section: bench/torch/torch_bench.py (the same Python
loops over backend "shm" and backend "gloo", in one run), printed after the main report,
with its rows in <stem>-torch.csv."""
import os
import subprocess

from . import runner

SCRIPT = os.path.join(runner.BENCH_DIR, "torch", "torch_bench.py")


def options(quick):
    if quick:
        return ["--ranks", "2", "--max-size", str(1 << 20), "--iterations", "20", "--warmup", "2"]
    return []  # the script's defaults: 4 B to 16 MiB, 2 and 4 ranks


def run(build_dir, stem, quick, timeout):
    """Returns (text, note): the tables, or why the section was skipped or failed."""
    package = os.path.join(build_dir, "python")
    if not os.path.isdir(os.path.join(package, "shmdist")):
        return "", "torch section skipped: the shm backend is not built in %s" % build_dir
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in [package, os.environ.get("PYTHONPATH", "")] if p))
    cmd = [runner.SYSTEM_PYTHON, SCRIPT, "--csv", stem + "-torch.csv"] + options(quick)
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "", "torch section failed: no result within %d s" % timeout
    if out.returncode == 3:
        return "", "torch section skipped: " + out.stderr.strip()
    if out.returncode != 0:
        return out.stdout, "torch section failed (exit %d): %s" % (out.returncode,
                                                                  out.stderr.strip()[-500:])
    return out.stdout + "\nCSV: %s-torch.csv" % stem, ""
