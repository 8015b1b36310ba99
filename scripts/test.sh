#!/usr/bin/env bash
# Sets up, builds and runs every test: the ci preset (optimised), the Python package as users get it
# (`pip install .` into a fresh virtual environment, its tests run against the installed package; built with
# pybind11's GIL assertions, GDSKIT_PYTHON_GIL_CHECKS=ON), then
# AddressSanitizer+UBSan and ThreadSanitizer builds. GPU tests skip with their reason on a machine without a GPU.
#   GDSKIT_SKIP_SANITIZERS=1   only the ci preset and the Python package
#   GDSKIT_PYTHON=/path/python the interpreter of the virtual environment (default: /usr/bin/python3)
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
scripts/setup.sh --tests

jobs=$(nproc)
work=
# Device profiles that the tests tune or learn go here, never into the user's cache folder.
profiles=$(mktemp -d "${TMPDIR:-/tmp}/gdskit-test-profiles.XXXXXX")
export XDG_CACHE_HOME=$profiles
trap '[ -z "$work" ] || rm -rf "$work"; rm -rf "$profiles"' EXIT
stage_start=$SECONDS
stage_done() { echo "== $1: done in $((SECONDS - stage_start)) s"; stage_start=$SECONDS; }

# run_preset PRESET [ctest arguments...]
run_preset() {
  local preset=$1
  shift
  echo "== $preset: configure and build"
  cmake --preset "$preset" >/dev/null
  cmake --build --preset "$preset" -j "$jobs"
  echo "== $preset: test"
  ctest --preset "$preset" -j "$jobs" --timeout 900 "$@"
  stage_done "$preset"
}

# The documented install, from this checkout, into a new environment; the tests then import the installed
# package from a folder outside the checkout, so the build tree cannot stand in for it.
python_package() {
  echo "== python: pip install . into a fresh virtual environment"
  local py=${GDSKIT_PYTHON:-/usr/bin/python3}
  [ -x "$py" ] || py=$(command -v python3)
  work=$(mktemp -d "${TMPDIR:-/tmp}/gdskit-pytest.XXXXXX")
  # --system-site-packages: the tests use Debian's numpy and torch (and pytest) where they are installed.
  "$py" -m venv --system-site-packages "$work/venv"
  # With pybind11's GIL assertions: the extension's threads (saves, loads) must never touch a Python reference
  # count without the GIL, and with them on a test that does so fails instead of racing.
  GDSKIT_CMAKE_ARGS="${GDSKIT_CMAKE_ARGS:-} -DGDSKIT_PYTHON_GIL_CHECKS=ON" \
    PIP_DISABLE_PIP_VERSION_CHECK=1 "$work/venv/bin/pip" install "$src"
  local vpy=$work/venv/bin/python
  cd "$work"
  "$vpy" -c 'import gdskit, sys; f = gdskit.__file__; print("gdskit", gdskit.__version__, "from", f);
sys.exit(0 if f.startswith(sys.prefix) else "gdskit was not imported from the environment")'
  "$work/venv/bin/gdskit" version | head -1
  echo "== python: tests against the installed package"
  local rc=0
  if "$vpy" -c 'import pytest' 2>/dev/null; then
    "$vpy" -m pytest -q -p no:cacheprovider --rootdir "$work" "$src/python/tests" || rc=$?
    # 5: nothing was collected, which means the tests were not found, not that they passed.
    [ "$rc" = 5 ] && echo "python: no tests ran" >&2
  else
    local t ran=0 out
    for t in "$src"/python/tests/test_*.py; do
      ran=$((ran + 1))
      out=$("$vpy" "$t" 2>&1) || rc=$?
      printf '%s\n' "$out"
      # Exit 77 means the package could not be imported: a failure once it is installed.
      grep -q '^PASS ' <<<"$out" || { echo "python: no test passed in $t" >&2; rc=1; }
    done
    [ "$ran" -gt 0 ] || { echo "python: no tests ran (no python/tests/test_*.py)" >&2; rc=1; }
  fi
  cd "$src"
  [ "$rc" = 0 ] || { echo "== python: tests failed (status $rc)" >&2; return 1; }
  stage_done python
}

run_preset ci
python_package
if [ "${GDSKIT_SKIP_SANITIZERS:-0}" != 1 ]; then
  run_preset asan
  # ThreadSanitizer where threads are: the unit tests and the CLI runs. The corpus replays parse files on
  # one thread (ASan and UBSan cover them) and the install check is about packaging.
  run_preset tsan -LE fuzz -E '^cli_install_consumer$'
fi
echo "== all tests passed"
