#!/usr/bin/env bash
# Builds the portable binaries (libstdc++ static, third-party static or header-only) that scripts/gpu-run.sh
# runs on a GPU machine, and copies them into .carry/bin (ignored by git).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --preset portable >/dev/null
targets=(gdskit gdskit_cli gpu_paths_test file_handle_test io_faults_test pipeline_test batch_test batch_driver_test
         host_read_bench gpu_compare_bench first_transfer_bench batch_bench)
cmake --build build/portable -j "$(nproc)" --target "${targets[@]}"
mkdir -p .carry/bin
cp build/portable/apps/gdskit/gdskit build/portable/bench/host_read_bench build/portable/bench/gpu_compare_bench \
   build/portable/bench/first_transfer_bench build/portable/bench/batch_bench .carry/bin/
for t in gpu_paths_test file_handle_test io_faults_test pipeline_test batch_test batch_driver_test; do
  cp "build/portable/tests/$t" .carry/bin/
done
strip .carry/bin/* 2>/dev/null || true
# For building the Python extension on the GPU machine (its Python headers and pybind11 live there).
mkdir -p .carry/lib .carry/include/gdskit
cp build/portable/src/libgdskit.a .carry/lib/
uring=$(sed -n 's/^URING_STATIC_LIBRARY:FILEPATH=//p' build/portable/CMakeCache.txt)
[ -f "$uring" ] && cp "$uring" .carry/lib/
cp build/portable/include/gdskit/version.hpp .carry/include/gdskit/
du -sh .carry/bin
