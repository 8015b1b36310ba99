#!/usr/bin/env bash
# gdskit bench against hostile sizes and resource limits: every case ends in a clear exit code and a reason,
# never a crash, a signal or a half-written file.
# Usage: bench_limits.sh <gdskit binary> <source dir> <build dir>
set -u
gdskit=$1
[ -x "$gdskit" ] || { echo "no gdskit binary at $gdskit"; exit 77; }
work=$(mktemp -d "${TMPDIR:-/tmp}/gdskit-bench-limits.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# expect RC ARGS...: runs gdskit bench ARGS, wants exit RC and a reason on stderr.
expect() {
  local want=$1; shift
  local err rc
  err=$("$gdskit" bench "$@" 2>&1 >/dev/null)
  rc=$?
  [ $rc -eq "$want" ] || fail "bench $* exited $rc, want $want: $err"
  [ -n "$err" ] || fail "bench $* printed no reason"
}

head -c 65536 /dev/zero >"$work/data"

# Sizes, offsets and their sums past 2^63 - 1: refused before anything runs.
expect 2 -f "$work/new" -s 9223372036854775808 -w 2 -I 1
expect 2 -f "$work/new" -s 4611686018427387904 -w 2 -I 1
expect 2 -f "$work/data" -o 18446744073709551615 -s 4096 -i 4096
expect 2 -f "$work/new" -o 9223372036854771712 -s 8192 -i 4096 -I 1
[ ! -e "$work/new" ] || fail "a refused run created its file"

echo "ok"
