#!/usr/bin/env bash
# One exit-code table for every subcommand: 0 ok, 1 the check said no, 2 usage or bad input, 3 I/O or device
# failure during the run; each --help ends with it.
# Usage: exit_codes.sh <gdskit binary> <source dir> <build dir>
set -u
source "$(dirname "$0")/lib.bash" "$@"

for sub in doctor patch setup bench verify load version; do
  help=$("$gdskit" $sub --help 2>&1) || fail "$sub --help exited $?"
  grep -q '^Exit codes: 0 ok; 1 ' <<<"$help" || fail "$sub --help has no exit-code table: $help"
done
"$gdskit" --help | grep -q '^Exit codes: 0 ok; 1 ' || fail "gdskit --help has no exit-code table"

# A missing input file is bad input (2) for every subcommand that reads one.
expect 2 bench -f "$work/missing" -s 4K -i 4K
expect 2 load "$work/missing.safetensors"
expect 2 verify -D "$work/no/such/folder" -d cpu --sizes 4K

# A bad setting is bad input (2), not a failure during the run.
head -c 8192 /dev/zero >"$work/data"
GDSKIT_ENGINE=fast expect 2 bench -f "$work/data" -s 4K -i 4K
GDSKIT_ENGINE=fast expect 2 verify -D "$work" -d cpu --sizes 4K
GDSKIT_THREADS=lots expect 2 load "$work/data"
[ "$(ls "$work")" = data ] || fail "refused runs left files: $(ls "$work")"
# bench kv as well, before its folder is touched.
mkdir "$work/kv"
GDSKIT_ENGINE=fast expect 2 bench kv --dir "$work/kv" --mix put
GDSKIT_THREADS=0 expect 2 bench kv --dir "$work/kv" --mix put
[ -z "$(ls -A "$work/kv")" ] || fail "a refused bench kv left files: $(ls -A "$work/kv")"
rmdir "$work/kv"
# tune too, before it says it is measuring.
out=$(GDSKIT_ENGINE=fast "$gdskit" tune --path "$work" --no-save 2>/dev/null)
rc=$?
[ $rc -eq 2 ] || fail "tune with a bad setting exited $rc, want 2"
[ -z "$out" ] || fail "tune with a bad setting printed before refusing: $out"

# A value out of range names the variable the user set, not the field it went into.
for bad in GDSKIT_THREADS=0 GDSKIT_DIRECT_DEPTH=2000 GDSKIT_CHUNK_BYTES=6K GDSKIT_STAGING_SLOTS=1 \
           GDSKIT_STAGING_SLOT_BYTES=4K GDSKIT_CACHED_SLOT_BYTES=2G; do
  err=$(env "$bad" "$gdskit" bench -f "$work/data" -s 4K -i 4K 2>&1 >/dev/null)
  rc=$?
  [ $rc -eq 2 ] || fail "$bad: bench exited $rc, want 2: $err"
  grep -qF "setting ${bad%%=*}=" <<<"$err" || fail "$bad: the message does not name the variable: $err"
done

# A GPU load where no GPU is usable is refused as bad input (2), as verify and bench refuse it.
if "$gdskit" version | grep -q '^gpu: no'; then
  h='{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}'
  printf "\\x$(printf %02x ${#h})\\0\\0\\0\\0\\0\\0\\0%s\\x2a" "$h" >"$work/one.safetensors"
  expect 0 load "$work/one.safetensors"
  expect 2 load "$work/one.safetensors" --device 0
  rm "$work/one.safetensors"
fi

# Bad flags are usage errors (2).
expect 2 bench -f "$work/data" -s 4K -w 0
expect 2 verify --sizes 0 -d cpu
expect 2 load

# Success is 0.
expect 0 bench -f "$work/data" -s 4K -i 4K --quiet
expect 0 verify -D "$work" -d cpu --sizes 4K,4097
echo "ok"
