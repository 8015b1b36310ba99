#!/usr/bin/env bash
# The plan's O_DIRECT reason (printed by gdskit load -v, verify -v and doctor) says where the depth and request
# size come from, and names a setting that pins one with the value the user gave (docs/settings.md). Without -v
# the path line of load, verify and bench is one short line: the route and its first reason.
# Usage: plan_reasons.sh <gdskit binary> <source dir> <build dir>
set -u
source "$(dirname "$0")/lib.bash" "$@"

h='{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}'
printf "\\x$(printf %02x ${#h})\\0\\0\\0\\0\\0\\0\\0%s\\x2a" "$h" >"$work/one.safetensors"
mkdir -p "$work/cache"
load() { XDG_CACHE_HOME="$work/cache" "$gdskit" load -v "$work/one.safetensors" | sed -n 's/^path: //p'; }

plan=$(load) || fail "load failed"
grep -q 'O_DIRECT host reads' <<<"$plan" || { echo "skipped: $work refuses O_DIRECT ($plan)"; exit 77; }
grep -qF 'no profile (run gdskit tune); now depth 2, 4.00 MiB; adaptive' <<<"$plan" || fail "default start: $plan"

# The default line: short, the first reason, a pointer to -v; every reason only with -v.
short_ok() {  # WHAT LINE
  [ -n "$2" ] || fail "$1: no path line"
  [ ${#2} -le 100 ] || fail "$1: the path line is ${#2} characters: $2"
  grep -q 'with -v' <<<"$2" || fail "$1: the path line does not point at -v: $2"
  ! grep -q 'O_DIRECT' <<<"$2" || fail "$1: the path line carries the schedule's reasons: $2"
}
line=$(XDG_CACHE_HOME="$work/cache" "$gdskit" load "$work/one.safetensors" | grep '^path: ')
short_ok load "$line"
line=$(XDG_CACHE_HOME="$work/cache" "$gdskit" verify --host -D "$work" --sizes 4K | grep '^path: ')
short_ok verify "$line"
line=$(XDG_CACHE_HOME="$work/cache" "$gdskit" verify --host -D "$work" --sizes 4K -v | grep '^path: ')
grep -q 'O_DIRECT host reads: .*O_DIRECT host writes: ' <<<"$line" || fail "verify -v: $line"
head -c 1048576 /dev/zero >"$work/data"
line=$(XDG_CACHE_HOME="$work/cache" "$gdskit" bench -f "$work/data" -s 1M | grep '^  path: ')
short_ok bench "$line"
line=$(XDG_CACHE_HOME="$work/cache" "$gdskit" bench -f "$work/data" -s 1M -v | grep '^  path: ')
grep -q 'engine ' <<<"$line" && ! grep -q 'with -v' <<<"$line" || fail "bench -v: $line"
# --json keeps every reason.
XDG_CACHE_HOME="$work/cache" "$gdskit" load --json "$work/one.safetensors" | grep -q '"O_DIRECT host reads: ' ||
  fail "load --json lost the reasons"


plan=$(GDSKIT_ADAPTIVE=off GDSKIT_THREADS=8 GDSKIT_DIRECT_DEPTH=16 load)
grep -qF 'O_DIRECT host reads: depth 8, 4.00 MiB (fixed: GDSKIT_ADAPTIVE=off)' <<<"$plan" || fail "adaptive off: $plan"

# A depth above the workers is held to them, and the reason says both.
plan=$(GDSKIT_THREADS=4 GDSKIT_DIRECT_DEPTH=16 load)
grep -qF 'now depth 4, 4.00 MiB; adaptive (measuring); GDSKIT_DIRECT_DEPTH=16 wins, held to GDSKIT_THREADS=4' \
  <<<"$plan" || fail "depth above the workers: $plan"
plan=$(GDSKIT_THREADS=8 GDSKIT_DIRECT_DEPTH=2 load)
grep -qF 'now depth 2, 4.00 MiB; adaptive (measuring); GDSKIT_DIRECT_DEPTH=2 wins)' <<<"$plan" || fail "depth 2: $plan"
plan=$(GDSKIT_CHUNK_BYTES=8M load)
grep -qF 'now depth 2, 8.00 MiB; adaptive (measuring); GDSKIT_CHUNK_BYTES=8388608 wins)' <<<"$plan" ||
  fail "chunk size: $plan"
echo "ok"
