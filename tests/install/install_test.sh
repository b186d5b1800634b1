#!/usr/bin/env bash
# Installs the build tree into a temporary prefix, then builds and runs an outside project
# against it twice: with find_package(shmdist CONFIG) and with pkg-config.
set -euo pipefail
build_dir=$1 source_dir=$2 compiler=$3 python=${4:-}  # python: the torch backend's, if built
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
test -x "$work/prefix/bin/shmrun"
if [[ -x "$build_dir/bench/shmdist-bench" ]]; then test -x "$work/prefix/bin/shmdist-bench"; fi
test -f "$work/prefix/include/shmdist/shmdist.hpp"
# The torch backend, when built: the package imports from the prefix and registers "shm".
if [[ -n "$python" ]]; then
  site="$work/prefix/lib/python3/dist-packages"
  test -f "$site/shmdist/torch.py"
  PYTHONPATH="$site" "$python" -c "import shmdist.torch, torch.distributed as d
assert 'SHM' in d.Backend._plugins and shmdist.torch.__file__.startswith('$site'), shmdist.torch.__file__"
fi
cmake -S "$source_dir" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" \
      -DCMAKE_CXX_COMPILER="$compiler" >/dev/null
cmake --build "$work/build" >/dev/null
expected=$'tensor([10, 20, 30, 40])\nFrom 0: tensor([7., 8., 9.])'
out=$("$work/build/uses_shmdist")
if [[ "$out" != "$expected" ]]; then
  echo "find_package build printed:"; echo "$out"; echo "expected:"; echo "$expected"; exit 1
fi
if command -v pkg-config >/dev/null; then
  export PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig:$work/prefix/lib/x86_64-linux-gnu/pkgconfig"
  # shellcheck disable=SC2046
  "$compiler" "$source_dir/main.cpp" -o "$work/pc_build" $(pkg-config --cflags --libs shmdist)
  out=$("$work/pc_build")
  [[ "$out" == "$expected" ]] || { echo "pkg-config build printed: $out"; exit 1; }
fi
echo "outside project built and ran against the installed tree"
