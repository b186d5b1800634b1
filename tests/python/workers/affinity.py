"""A rank of tests/python/test_hosts.py's test of emulated hosts' CPUs: prints the CPUs it may
run on, as `CPUS 0,1`."""
import os

print("CPUS " + ",".join(map(str, sorted(os.sched_getaffinity(0)))), flush=True)
