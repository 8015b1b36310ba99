#!/usr/bin/env bash
# Adds the block store's test programs to the portable pack that scripts/gpu-pack.sh makes (.carry/bin), for
# scripts/gpu-kv-run.sh on a GPU machine. Runs gpu-pack.sh first unless --no-base.
#   scripts/gpu-kv-pack.sh [--no-base]
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" != --no-base ]; then
  scripts/gpu-pack.sh
fi
cmake --preset portable >/dev/null
cmake --build build/portable -j "$(nproc)" --target kv_store_test kv_faults_test
mkdir -p .carry/bin
cp build/portable/tests/kv_store_test build/portable/tests/kv_faults_test .carry/bin/
strip .carry/bin/kv_store_test .carry/bin/kv_faults_test 2>/dev/null || true
ls -la .carry/bin/kv_store_test .carry/bin/kv_faults_test
