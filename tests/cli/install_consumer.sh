#!/usr/bin/env bash
# The installed package as its users see it. This build is installed into a prefix that is then moved
# (an installed tree must not remember where it was made), and tests/consumer is built against the moved
# tree twice: with find_package(gdskit) and with pkg-config. The CMake and pkg-config files may name no
# absolute path and no private dependency (fmt, nlohmann-json, liburing, CLI11), the tools behind the CLI
# are not installed, and the installed CLI runs. A static build also builds and checks the shared variant
# (BUILD_SHARED_LIBS=ON, library only, linked from this build's objects: the packaging is what is tested).
set -euo pipefail
gdskit_bin=$1 src=$2 build=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

flags=$(sed -n 's/^CMAKE_CXX_FLAGS:STRING=//p' "$build/CMakeCache.txt")   # sanitizer builds: same flags
shared=$(sed -n 's/^BUILD_SHARED_LIBS:BOOL=//p' "$build/CMakeCache.txt")
cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")

# check_install BUILD_DIR NAME KIND(static|shared) WITH_CLI(0|1)
check_install() {
  local b=$1 name=$2 kind=$3 with_cli=$4
  local made=$tmp/$name-made/prefix moved=$tmp/$name-moved/prefix
  cmake --install "$b" --prefix "$made" >/dev/null
  mkdir -p "$(dirname "$moved")"
  mv "$made" "$moved"
  rmdir "$(dirname "$made")"

  local cmakedir pc
  cmakedir=$(dirname "$(find "$moved" -name gdskitConfig.cmake)")
  pc=$(find "$moved" -name gdskit.pc)
  [ -n "$pc" ] || fail "$name: no gdskit.pc installed"
  [ "$(basename "$(dirname "$pc")")" = pkgconfig ] || fail "$name: gdskit.pc not under lib/pkgconfig: $pc"
  if grep -rlF "$made" "$moved" >/dev/null; then fail "$name: installed files name the install prefix: $(grep -rlF "$made" "$moved")"; fi
  # No absolute path and no private dependency in what users' builds read.
  local f
  for f in "$cmakedir"/*.cmake "$pc"; do
    if grep -vE '^\s*#' "$f" | grep -nE '(^|[^}A-Za-z0-9_.-])/(usr|lib|lib64|opt|home|tmp|var|work|root|build)\b'; then
      fail "$name: absolute path in $(basename "$f")"
    fi
    if grep -vE '^\s*#' "$f" | grep -niE '\bfmt\b|nlohmann|liburing|\buring\b|CLI11'; then
      fail "$name: private dependency named in $(basename "$f")"
    fi
  done
  if find "$moved" \( -name '*gdskit_tools*' -o -name '*gdskit_bench*' -o -name '*gdskit_doctor*' -o -name '*gdskit_patch*' \) |
    grep -q .; then fail "$name: a tools library is installed"; fi

  local lib
  if [ "$kind" = shared ]; then
    lib=$(find "$moved" -name 'libgdskit.so.*.*.*')
    [ -n "$lib" ] || fail "$name: no libgdskit.so.X.Y.Z"
    readelf -d "$lib" | grep -q "SONAME.*\[libgdskit\.so\.[0-9]*\.[0-9]*\]" || fail "$name: libgdskit.so has no SONAME"
    if readelf -d "$lib" | grep NEEDED | grep -i uring; then fail "$name: libgdskit.so needs liburing at run time"; fi
    # Only the public API of include/gdskit: no internals, no fmt, nlohmann-json, liburing or CLI11.
    python3 "$src/scripts/check-exports.py" --library "$lib" >/dev/null || fail "$name: libgdskit.so exports more than the public API"
    if find "$moved" -name 'libgdskit.a' | grep -q .; then fail "$name: a shared build installed libgdskit.a"; fi
  else
    find "$moved" -name 'libgdskit.a' | grep -q . || fail "$name: no libgdskit.a"
  fi

  # find_package(gdskit)
  cmake -S "$src/tests/consumer" -B "$tmp/$name-cmake" -G Ninja -DCMAKE_PREFIX_PATH="$moved" \
        -DCMAKE_CXX_FLAGS="$flags" >/dev/null
  cmake --build "$tmp/$name-cmake" >/dev/null
  "$tmp/$name-cmake/consumer" "$tmp/roundtrip.dat" | sed "s/^/$name find_package: /"

  # pkg-config: static users link with --static.
  local pcflags
  if [ "$kind" = static ]; then
    pcflags=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --static --cflags --libs gdskit)
  else
    pcflags=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --cflags --libs gdskit)
  fi
  # shellcheck disable=SC2086 # flags are word lists
  "$cxx" -std=c++20 $flags "$src/tests/consumer/main.cpp" -o "$tmp/$name-pc" $pcflags
  LD_LIBRARY_PATH=$(dirname "$(find "$moved" -name 'libgdskit.*' | head -1)") \
    "$tmp/$name-pc" "$tmp/roundtrip.dat" | sed "s/^/$name pkg-config: /"

  if [ "$with_cli" = 1 ]; then
    test -x "$moved/bin/gdskit" || fail "$name: no bin/gdskit"
    "$moved/bin/gdskit" version | head -1 | sed "s/^/$name cli: /"
  fi
}

kind=static
[ "$shared" = ON ] && kind=shared
check_install "$build" this "$kind" 1

if [ "$kind" = static ] && [[ "$flags" != *-fsanitize* ]]; then
  # The shared variant is linked from this build's object files (position independent): its packaging is
  # what is tested, and the core is not compiled a second time.
  unity=$(sed -n 's/^GDSKIT_UNITY_BUILD:BOOL=//p' "$build/CMakeCache.txt")
  cmake -S "$src" -B "$tmp/shared-build" -G Ninja -DBUILD_SHARED_LIBS=ON -DCMAKE_BUILD_TYPE= \
        -DGDSKIT_PREBUILT_CORE_OBJECTS="$build/src/CMakeFiles/gdskit.dir" -DGDSKIT_UNITY_BUILD="${unity:-OFF}" \
        -DGDSKIT_BUILD_CLI=OFF -DGDSKIT_BUILD_TESTS=OFF -DGDSKIT_BUILD_BENCHMARKS=OFF \
        -DGDSKIT_BUILD_EXAMPLES=OFF -DGDSKIT_BUILD_PYTHON=OFF >"$tmp/shared.log" 2>&1 ||
    { tail -30 "$tmp/shared.log" >&2; fail "shared: configure failed"; }
  cmake --build "$tmp/shared-build" -j "$(nproc)" >>"$tmp/shared.log" 2>&1 ||
    { grep -m 20 -E 'error|multiple definition|undefined reference' "$tmp/shared.log" >&2; fail "shared: build failed"; }
  check_install "$tmp/shared-build" shared shared 0
fi
