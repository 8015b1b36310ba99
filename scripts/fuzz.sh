#!/usr/bin/env bash
# Builds a libFuzzer target with clang (ASan + UBSan; the whole library carries coverage instrumentation, not just
# the target) and runs it for a number of seconds.
#
#   scripts/fuzz.sh [TARGET] [SECONDS] [extra libFuzzer flags...]
#   scripts/fuzz.sh safetensors 600
#
# TARGET is the name after fuzz_ in tests/fuzz/fuzz_<name>.cpp (default: safetensors); SECONDS defaults to 60.
# The committed seed corpus (tests/fuzz/corpus/<name>/) is only read; inputs the fuzzer finds go to
# build/fuzz/corpus-<name>/, crashes to build/fuzz/artifacts-<name>/, the log to build/fuzz/<name>.log.
# Add a crash to the seed corpus after fixing it, so the replay test on CI keeps it fixed.
# Environment: GDSKIT_SOURCE_DIR (default: this repository), GDSKIT_FUZZ_BUILD (default: build/fuzz),
# CXX (default: clang++), JOBS (build parallelism, default 2).
set -euo pipefail

target="${1:-safetensors}"
seconds="${2:-60}"
shift $(( $# > 2 ? 2 : $# ))

here="$(cd "$(dirname "$0")/.." && pwd)"
src="${GDSKIT_SOURCE_DIR:-$here}"
build="${GDSKIT_FUZZ_BUILD:-$here/build/fuzz}"
cxx="${CXX:-clang++}"

if ! command -v "$cxx" >/dev/null; then
  echo "fuzz.sh: $cxx not found; libFuzzer needs clang" >&2
  exit 77
fi

cmake -S "$src" -B "$build" -G Ninja -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DGDSKIT_FUZZ=ON -DGDSKIT_BUILD_BENCHMARKS=OFF -DGDSKIT_BUILD_EXAMPLES=OFF -DGDSKIT_BUILD_PYTHON=OFF \
  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined" >/dev/null
cmake --build "$build" --target "fuzz_$target" -j "${JOBS:-2}"

seeds="$src/tests/fuzz/corpus/$target"
corpus="$build/corpus-$target"
artifacts="$build/artifacts-$target"
mkdir -p "$corpus" "$artifacts"
log="$build/$target.log"
echo "fuzz.sh: running fuzz_$target for ${seconds}s (log: $log)"
status=0
"$build/tests/fuzz/fuzz_$target" "$corpus" "$seeds" -max_total_time="$seconds" -print_final_stats=1 \
  -artifact_prefix="$artifacts/" -max_len=65536 "$@" >"$log" 2>&1 || status=$?
grep -E '^(#[0-9]+ +DONE|stat::|Done )' "$log" || tail -n 20 "$log"
crashes=$(find "$artifacts" -type f | wc -l)
echo "fuzz.sh: exit $status, corpus $(find "$corpus" -type f | wc -l) inputs, $crashes crash/leak/timeout files in $artifacts"
exit "$status"
