#!/usr/bin/env bash
# scripts/test on a fresh machine (issue 27, item 14): it installs what every test needs and
# configures the build so that nothing is left out or skipped. Run on a copy of scripts/ with
# fakes first on PATH, so nothing is installed and nothing is built:
#   dpkg-query  says that only the packages listed in $state/installed are installed
#   sudo        runs its command; apt-get, pip (in the venv), cmake and ctest log their arguments
#   python3     `python3 -m venv DIR` makes a venv whose python passes install-deps' check only
#               once its pip has installed something
# First run: nothing installed; every test's dependency must be asked for, the venv made with
# torch 2.13, and the build configured with SHMDIST_REQUIRE_ALL=ON. Second run: everything
# is there; nothing may be installed again.
#   test_scripts.sh SOURCE_DIR
set -euo pipefail
source_dir=$1
work=$(mktemp -d /tmp/shmdist-scripts-test-XXXXXX)
trap 'rm -rf "$work"' EXIT
repo=$work/repo state=$work/state fakes=$work/bin
mkdir -p "$repo" "$state" "$fakes"
cp -r "$source_dir/scripts" "$repo/"
: > "$state/installed"

cat > "$fakes/dpkg-query" <<'FAKE'
#!/usr/bin/env bash
# dpkg-query -W -f='${Status}' PACKAGE
pkg=${!#}
if grep -qx "$pkg" "$FAKE_STATE/installed"; then printf 'install ok installed'; exit 0; fi
exit 1
FAKE
cat > "$fakes/sudo" <<'FAKE'
#!/usr/bin/env bash
exec "$@"
FAKE
cat > "$fakes/apt-get" <<'FAKE'
#!/usr/bin/env bash
echo "apt-get $*" >> "$FAKE_STATE/log"
FAKE
cat > "$fakes/python3" <<'FAKE'
#!/usr/bin/env bash
# Only `python3 -m venv DIR` is expected.
[[ "$1 $2" == "-m venv" ]] || { echo "fake python3: unexpected $*" >&2; exit 3; }
mkdir -p "$3/bin"
cat > "$3/bin/python" <<'PY'
#!/usr/bin/env bash
[[ -e "$FAKE_STATE/venv_complete" ]]
PY
cat > "$3/bin/pip" <<'PIP'
#!/usr/bin/env bash
echo "pip $*" >> "$FAKE_STATE/log"
touch "$FAKE_STATE/venv_complete"
PIP
chmod +x "$3/bin/python" "$3/bin/pip"
FAKE
for tool in cmake ctest; do
  printf '#!/usr/bin/env bash\necho "%s $*" >> "$FAKE_STATE/log"\n' "$tool" > "$fakes/$tool"
done
chmod +x "$fakes"/*

fail=0
expect() {  # expect DESCRIPTION GREP-PATTERN: the log has a line matching it
  if ! grep -qE -- "$2" "$state/log"; then
    echo "FAIL: $1 (no line matching '$2')"
    fail=1
  fi
}
run_scripts_test() {
  : > "$state/log"
  if ! env -u SHMDIST_BUILD_DIR FAKE_STATE="$state" PATH="$fakes:$PATH" SHMDIST_WERROR=OFF "$repo/scripts/test" \
         > "$state/out" 2>&1; then
    echo "FAIL: scripts/test failed:"; cat "$state/out"
    fail=1
  fi
}

# 1. A fresh machine.
run_scripts_test
asked_for() { sed -n 's/^apt-get install .*--no-install-recommends //p' "$state/log" | tr ' ' '\n'; }
for pkg in g++ cmake libboost-test-dev libcli11-dev openmpi-bin libopenmpi-dev python3-torch \
           libtorch-dev pybind11-dev python3-pytest python3-dev python3-venv; do
  asked_for | grep -qxF -- "$pkg" || { echo "FAIL: scripts/test does not install $pkg"; fail=1; }
done
expect "scripts/test makes the venv with torch 2.13 and pytest" "^pip install .*torch==2\.13\.0.* pytest"
[[ -x "$repo/.venv/bin/python" ]] || { echo "FAIL: no venv in $repo/.venv"; fail=1; }
expect "the build is configured so that a missing dependency fails it" \
       "^cmake -S \. -B build .*-DSHMDIST_REQUIRE_ALL=ON"
expect "scripts/test runs CTest" "^ctest --test-dir build"

# 2. The same machine once everything is installed: nothing is installed again.
asked_for | grep -v '^$' >> "$state/installed"
run_scripts_test
if grep -qE '^(apt-get|pip) ' "$state/log"; then
  echo "FAIL: the second run installed again:"; grep -E '^(apt-get|pip) ' "$state/log"
  fail=1
fi
expect "the second run still builds and tests" "^ctest --test-dir build"

[[ $fail -eq 0 ]] && echo "scripts/test installs what every test needs, once"
exit $fail
