#!/usr/bin/env bash
# Installs the build into a temporary prefix and builds tests/consumer against it with find_package(gdskit).
set -euo pipefail
gdskit_bin=$1 src=$2 build=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
# Sanitizer builds need the same flags in the consumer.
flags=$(sed -n 's/^CMAKE_CXX_FLAGS:STRING=//p' "$build/CMakeCache.txt")
cmake -S "$src/tests/consumer" -B "$tmp/build" -G Ninja -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_CXX_FLAGS="$flags" >/dev/null
cmake --build "$tmp/build" >/dev/null
"$tmp/build/consumer" "$tmp/roundtrip.dat"
test -x "$tmp/prefix/bin/gdskit"
"$tmp/prefix/bin/gdskit" version | head -1
