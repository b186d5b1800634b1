"""Helpers for the workers: each check runs on every rank and prints one line per rank,
"PASS <name>" or "FAIL <name>: <error>", which the pytest side collects."""

import os
import sys
import traceback

import torch
import torch.distributed as dist


# torch 2.x checks more in Python and in its dispatcher before a call reaches a backend.
TORCH2 = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 0)


def backend_of(group=None):
    """The backend object itself (ProcessGroupShm): the group on torch 1.13, its CPU backend
    on 2.x, where torch wraps backends in a ProcessGroup of its own."""
    from torch.distributed import distributed_c10d as c10d
    group = c10d._get_default_group() if group is None else group
    return group._get_backend(torch.device("cpu")) if TORCH2 else group


def say(line):
    """Prints one line with one write(2): the ranks of a job share one pipe, and print()
    writes the text and its newline separately when Python's output is unbuffered
    (PYTHONUNBUFFERED), so another rank's line could land between the two and hide this one
    from the test's line-by-line parsing. One write of less than PIPE_BUF bytes stays whole."""
    data = (line + "\n").encode()
    while data:
        data = data[os.write(1, data):]


def run_checks(checks, group_label=""):
    rank = dist.get_rank()
    for check in checks:
        name = check.__name__ + (f"[{group_label}]" if group_label else "")
        try:
            check()
            say(f"PASS {name} rank={rank}")
        except Exception:  # noqa: BLE001 - reported, the next check still runs
            text = traceback.format_exc().strip().replace("\n", " | ")
            say(f"FAIL {name} rank={rank}: {text}")


def expect(condition, what):
    if not condition:
        raise AssertionError(what)


def expect_equal(actual, expected, what=""):
    same = actual.dtype == expected.dtype and actual.shape == expected.shape
    if same and actual.is_complex():  # torch.equal has no complex32 kernel: compare the parts
        actual, expected = torch.view_as_real(actual), torch.view_as_real(expected)
    if not same or not torch.equal(actual, expected):
        raise AssertionError(f"{what}: expected {expected!r}, got {actual!r}")


def expect_raises(fragment, call):
    try:
        call()
    except RuntimeError as e:
        if fragment not in str(e):
            raise AssertionError(f"expected a RuntimeError containing {fragment!r}, got {e}") from e
        return e
    raise AssertionError(f"expected a RuntimeError containing {fragment!r}, nothing was raised")


# Every CPU dtype torch 1.13 has that the backend carries (quantized dtypes are refused).
DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
          torch.float16, torch.bfloat16, torch.float32, torch.float64,
          torch.complex32, torch.complex64, torch.complex128]


REAL_OF = {torch.complex32: torch.float16, torch.complex64: torch.float32,
           torch.complex128: torch.float64}


def sample(dtype, seed, n=5):
    """A tensor of `n` values of `dtype` that depends on `seed` (distinct per rank)."""
    base = torch.arange(n, dtype=torch.float64) + 3 * seed
    if dtype == torch.bool:
        return (torch.arange(n) + seed) % 2 == 0
    if dtype.is_complex:
        return torch.view_as_complex(torch.stack([base, base + 0.5], dim=-1).to(REAL_OF[dtype]))
    return base.to(dtype)


def members(group):
    """Global ranks of the group's members, in group-rank order."""
    if group is None:
        return list(range(dist.get_world_size()))
    ranks = dist.distributed_c10d._pg_group_ranks[group]
    return sorted(ranks, key=lambda g: ranks[g])


def init():
    timeout = float(os.environ.get("SHMDIST_TEST_TIMEOUT_S", "60"))
    from datetime import timedelta
    import shmdist.torch  # noqa: F401
    method = os.environ.get("SHMDIST_TEST_INIT", "env://")
    kwargs = {}
    if method != "env://":
        kwargs = dict(rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    dist.init_process_group(backend="shm", init_method=method, timeout=timedelta(seconds=timeout), **kwargs)


def finish():
    dist.destroy_process_group()
    sys.stdout.flush()
