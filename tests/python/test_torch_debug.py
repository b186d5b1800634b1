"""The torch backend "shm" under TORCH_DISTRIBUTED_DEBUG=DETAIL, where torch 2.x wraps every
group of a plugin backend in its ProcessGroupWrapper (which needs the backend's sequence
numbers and checks each collective across ranks)."""

from conftest import WORKERS, env_ranks, failures


def test_debug_detail_wraps_groups_and_reports_mismatches():
    results = env_ranks(2, WORKERS / "debug_detail.py",
                        extra_env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL", "SHMDIST_TEST_TIMEOUT_S": "30"})
    text = "".join(r.stdout for r in results)
    assert not failures(text), "\n".join(failures(text)) + "\n" + repr(results[0])
    for r in range(2):
        assert f"DONE rank={r}" in text, results
    assert all(r.returncode == 0 for r in results), results
