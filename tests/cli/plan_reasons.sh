#!/usr/bin/env bash
# The plan's O_DIRECT reason (printed by gdskit load, verify and doctor) says where the depth and request size
# come from, and names a setting that pins one with the value the user gave (docs/settings.md).
# Usage: plan_reasons.sh <gdskit binary> <source dir> <build dir>
set -u
source "$(dirname "$0")/lib.bash" "$@"

h='{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}'
printf "\\x$(printf %02x ${#h})\\0\\0\\0\\0\\0\\0\\0%s\\x2a" "$h" >"$work/one.safetensors"
mkdir -p "$work/cache"
load() { XDG_CACHE_HOME="$work/cache" "$gdskit" load "$work/one.safetensors" | sed -n 's/^path: //p'; }

plan=$(load) || fail "load failed"
grep -q 'O_DIRECT host reads' <<<"$plan" || { echo "skipped: $work refuses O_DIRECT ($plan)"; exit 77; }
grep -qF 'no profile (run gdskit tune); now depth 2, 4.00 MiB; adaptive' <<<"$plan" || fail "default start: $plan"

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
