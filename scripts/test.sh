#!/usr/bin/env bash
# Sets up, builds and runs every test: the ci preset (optimised), then AddressSanitizer+UBSan and
# ThreadSanitizer builds. GPU tests skip with their reason on a machine without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

jobs=$(nproc)
run_preset() {
  local preset=$1
  echo "== $preset: configure and build"
  cmake --preset "$preset" >/dev/null
  cmake --build --preset "$preset" -j "$jobs"
  echo "== $preset: test"
  ctest --preset "$preset" -j "$jobs" --timeout 900
}

run_preset ci
if [ "${GDSKIT_SKIP_SANITIZERS:-0}" != 1 ]; then
  run_preset asan
  run_preset tsan
fi
echo "== all tests passed"
