#!/usr/bin/env bash
# Builds bench/peers/kvikio_random_reads: KvikIO's C++ library (POSIX path only, no cuFile, no remote I/O) and the
# benchmark compiled together into one executable with plain g++, no CMake and no network, from the bundled peer
# sources in PEERDIR (PEERDIR/src/{kvikio,rapids-logger,spdlog,thread-pool,nvtx3}).
# Nothing from CUDA is linked: the benchmark and KvikIO both dlopen libcuda.so.1 at run time, so only cuda.h is
# needed here. libstdc++/libgcc are linked statically so the binary runs on a machine with an older or no g++.
#
#   scripts/build-kvikio-peer.sh PEERDIR OUT
#   Environment: CXX (g++), CUDA_HOME (/usr/local/cuda), JOBS (nproc)
set -euo pipefail

usage() {
  echo "usage: $(basename "$0") PEERDIR OUT"
  echo "  PEERDIR  the KvikIO peer folder (holding src/kvikio/include, src/rapids-logger, ...)"
  echo "  OUT      the executable to write (the benchmark bench/peers/kvikio_random_reads with KvikIO built in)"
  echo "  Environment: CXX (g++), CUDA_HOME (/usr/local/cuda), JOBS (nproc)"
}
die() {
  echo "$(basename "$0"): $*" >&2
  exit 1
}

if [ $# -eq 1 ] && { [ "$1" = --help ] || [ "$1" = -h ]; }; then
  usage
  exit 0
fi
if [ $# -ne 2 ]; then
  usage >&2
  exit 2
fi

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PEER=$(cd "$1" 2>/dev/null && pwd) || die "no such directory: $1"
OUT=$2
CXX=${CXX:-g++}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
SRC=$PEER/src
BENCH=$ROOT/bench/peers/kvikio_random_reads.cpp

[ -d "$SRC/kvikio/include" ] || die "$SRC/kvikio/include not found: is $PEER a KvikIO peer folder?"
command -v "$CXX" >/dev/null || die "C++ compiler '$CXX' not found (set CXX)"
[ -f "$CUDA_HOME/include/cuda.h" ] || die "$CUDA_HOME/include/cuda.h not found (set CUDA_HOME)"
[ -f "$BENCH" ] || die "$BENCH not found"
case $OUT in
  */) die "OUT must name a file, not a directory: $OUT" ;;
esac
OUT_DIR=$(dirname "$OUT")
[ -d "$OUT_DIR" ] || die "directory of OUT does not exist: $OUT_DIR"

BUILD=$(mktemp -d "${TMPDIR:-/tmp}/kvikio-peer.XXXXXX")
trap 'rm -rf "$BUILD"' EXIT

# KvikIO's CMake generates its logging macros from rapids-logger's template (create_logger_macros); do the same.
mkdir -p "$BUILD/include/kvikio" "$BUILD/obj"
template=$SRC/rapids-logger/cmake/logger_macros.hpp.in
[ -f "$template" ] || die "$template not found"
sed -e 's/@_RAPIDS_LOGGER_MACRO_PREFIX@/KVIKIO/g' -e 's/@_RAPIDS_LOGGER_DEFAULT_LOGGER@/kvikio::default_logger()/g' \
  "$template" >"$BUILD/include/kvikio/logger_macros.hpp"

# The library sources of KvikIO's CMake build without cuFile (no KVIKIO_CUFILE_FOUND) and without remote I/O
# (KvikIO_REMOTE_SUPPORT=OFF: no libcurl), plus the one compiled file of rapids-logger.
kvikio_sources=(
  batch bounce_buffer buffer compat_mode compat_mode_manager http_status_codes cufile/config cufile/driver defaults
  error file_handle file_utils logger mmap stream utils
  detail/bounce_buffer_cache detail/concurrent_request_limiter detail/env detail/event detail/nvtx detail/posix_io
  detail/stream detail/utils
  shim/cuda shim/cufile shim/utils
)
sources=()
for s in "${kvikio_sources[@]}"; do sources+=("$SRC/kvikio/src/$s.cpp"); done
sources+=("$SRC/rapids-logger/src/logger.cpp" "$BENCH")
for s in "${sources[@]}"; do [ -f "$s" ] || die "source not found: $s"; done

# As KvikIO's CMake builds it: C++20 with GNU extensions, Release, its default compiled-in log level (TRACE; what
# is printed is still chosen at run time by KVIKIO_LOG_LEVEL, off by default).
flags=(
  -std=gnu++20 -O2 -DNDEBUG -pthread
  -DKVIKIO_LOG_ACTIVE_LEVEL=RAPIDS_LOGGER_LOG_LEVEL_TRACE
  -I"$SRC/kvikio/include" -I"$BUILD/include" -I"$SRC/thread-pool/include" -I"$SRC/rapids-logger/include"
  -I"$SRC/spdlog/include" -I"$SRC/nvtx3/include" -I"$CUDA_HOME/include"
)
# The workers are separate shells: hand them the flags NUL-separated through a file (arrays cannot be exported).
printf '%s\0' "${flags[@]}" >"$BUILD/flags"

compile() {
  local obj=$1 src=$2
  local -a f
  mapfile -d '' f <"$BUILD/flags"
  if ! "$CXX" "${f[@]}" -c "$src" -o "$obj"; then
    echo "build-kvikio-peer.sh: FAILED to compile $src" >&2
    return 1
  fi
}
export -f compile
export BUILD CXX

compiler=$("$CXX" -dumpfullversion 2>/dev/null || echo "?")
echo "$(basename "$0"): compiling ${#sources[@]} files with $JOBS jobs ($CXX $compiler)" >&2
i=0
# shellcheck disable=SC2016  # $1 and $2 are the worker's own arguments, expanded in the worker
for s in "${sources[@]}"; do
  printf '%s\0%s\0' "$BUILD/obj/$i.o" "$s"
  i=$((i + 1))
done | xargs -0 -n 2 -P "$JOBS" bash -c 'compile "$1" "$2"' _ || die "compilation failed (see above)"

"$CXX" -o "$BUILD/exe" "$BUILD"/obj/*.o -static-libstdc++ -static-libgcc -pthread -ldl
strip -s "$BUILD/exe"
mv -f "$BUILD/exe" "$OUT"
echo "built $OUT"
