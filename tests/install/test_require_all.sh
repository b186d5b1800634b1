#!/usr/bin/env bash
# SHMDIST_REQUIRE_ALL (issue 27, item 14): with it, a missing dependency of some test fails
# the configure, naming it, instead of leaving tests out or skipping them; without it, the
# same build configures (the library and the rest of the suite do not need them). Missing
# dependencies are simulated with the build's own switches: SHMDIST_MPI=OFF (no MPI), an
# interpreter that does not exist (no torch 1.13, no torch 2.13 venv).
#   test_require_all.sh SOURCE_DIR CXX_COMPILER
set -euo pipefail
source_dir=$1 cxx=$2
work=$(mktemp -d /tmp/shmdist-require-all-XXXXXX)
trap 'rm -rf "$work"' EXIT
fail=0 n=0
# configure EXPECTED-STATUS EXPECTED-TEXT CMAKE-ARGS...
configure() {
  local expected=$1 text=$2
  shift 2
  n=$((n + 1))
  local status=0
  cmake -S "$source_dir" -B "$work/build$n" -DCMAKE_CXX_COMPILER="$cxx" -DSHMDIST_BUILD_BENCH=OFF \
        "$@" > "$work/out$n" 2>&1 || status=$?
  if [[ $expected == fails && $status -eq 0 ]] || [[ $expected == works && $status -ne 0 ]]; then
    echo "FAIL: cmake $* (exit $status), expected: it $expected"; tail -20 "$work/out$n"
    fail=1
  elif ! grep -qF -- "$text" "$work/out$n"; then
    echo "FAIL: cmake $* does not say '$text':"; tail -20 "$work/out$n"
    fail=1
  fi
  rm -rf "$work/build$n"
}
configure fails "no MPI" -DSHMDIST_REQUIRE_ALL=ON -DSHMDIST_MPI=OFF
configure fails "the torch backend is not built: no Python interpreter with torch" \
          -DSHMDIST_REQUIRE_ALL=ON -DSHMDIST_PYTHON_EXECUTABLE=/nonexistent/python3
configure fails "no build of the torch backend for /nonexistent/python" \
          -DSHMDIST_REQUIRE_ALL=ON -DSHMDIST_PYTHON_EXTRA_EXECUTABLES=/nonexistent/python
configure works "no MPI" -DSHMDIST_MPI=OFF -DSHMDIST_PYTHON_EXECUTABLE=/nonexistent/python3
[[ $fail -eq 0 ]] && echo "SHMDIST_REQUIRE_ALL fails the configure for each missing dependency"
exit $fail
