#!/bin/sh
# Emulates hosts on one machine: runs "$@" with SHMDIST_HOST_ID set to this rank's entry of
# SHMDIST_TEST_HOSTS (a comma-separated list indexed by OMPI_COMM_WORLD_RANK).
i=$((OMPI_COMM_WORLD_RANK + 1))
SHMDIST_HOST_ID=$(printf '%s\n' "$SHMDIST_TEST_HOSTS" | cut -d, -f"$i")
export SHMDIST_HOST_ID
exec "$@"
