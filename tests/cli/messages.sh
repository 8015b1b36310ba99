#!/usr/bin/env bash
# What a user reads when something is wrong: the cause said once, the user's path named (never a temporary
# file's), the fix suggested, and bad input refused (exit 2) before any work.
# Usage: messages.sh <gdskit binary> <source dir> <build dir>
set -u
source "$(dirname "$0")/lib.bash" "$@"

# err ARGS...: gdskit's stderr, wanting exit 2.
err() {
  local out rc
  out=$("$gdskit" "$@" 2>&1 >/dev/null); rc=$?
  [ $rc -eq 2 ] || fail "gdskit $* exited $rc, want 2: $out"
  printf '%s' "$out"
}
# once TEXT WORDS: WORDS occurs exactly once in TEXT.
once() { [ "$(grep -oF -- "$2" <<<"$1" | wc -l)" -eq 1 ] || fail "'$2' not said exactly once: $1"; }

h='{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"U8","shape":[0],"data_offsets":[16,16]}}'
printf "\\x$(printf %02x ${#h})\\0\\0\\0\\0\\0\\0\\0%s" "$h" >"$work/m.safetensors"
head -c 16 /dev/zero >>"$work/m.safetensors"
size=$(stat -c %s "$work/m.safetensors")
head -c $((size - 4)) "$work/m.safetensors" >"$work/cut.safetensors"

# A cut file is truncated, with the counts; the empty tensor at its end is not blamed.
e=$(err load "$work/cut.safetensors")
grep -qF "truncated: expected $size bytes, the file has $((size - 4))" <<<"$e" || fail "truncated: $e"
grep -qF 'tensor "a"' <<<"$e" && ! grep -qF 'tensor "b"' <<<"$e" || fail "blamed the wrong tensor: $e"
# Another kind of file, of any length, is called what it is.
printf 'hello world, these are notes\n' >"$work/notes.txt"
printf '12345678' >"$work/eight"
for f in notes.txt eight; do
  e=$(err load "$work/$f")
  grep -q "not a safetensors file" <<<"$e" && ! grep -q "header length [0-9]\|exceeds" <<<"$e" || fail "$f: $e"
done

# --save: an existing file names --force; a missing folder names the user's path; both before the model is read
# (the cut file would fail the load: the save's problem is the one reported).
e=$(err load "$work/cut.safetensors" --save "$work/m.safetensors")
grep -qF -- "--save \"$work/m.safetensors\": exists; --force replaces it" <<<"$e" || fail "existing: $e"
! grep -q "overwrite" <<<"$e" || fail "the library's word for the flag: $e"
e=$(err load "$work/cut.safetensors" --save "$work/no/such/out.safetensors")
grep -qF -- "--save \"$work/no/such/out.safetensors\": its folder $work/no/such does not exist" <<<"$e" ||
  fail "missing folder: $e"
! grep -q "gdskit-tmp\|No such file or directory" <<<"$e" || fail "missing folder, said twice or of a temp file: $e"

# verify: host memory takes the host path only, said in words; a missing folder is named as given.
e=$(err verify -d cpu -x gds --sizes 4K -D "$work")
grep -q "\-x gds moves GPU memory, but -d cpu verifies host memory" <<<"$e" || fail "-d cpu -x gds: $e"
err verify --host -x staged --sizes 4K -D "$work" >/dev/null
e=$(err verify --host -D "$work/nope" --sizes 4K)
grep -qF "gdskit verify: -D $work/nope: does not exist" <<<"$e" || fail "missing -D: $e"
! grep -q "gdskit-verify\." <<<"$e" || fail "missing -D named the test file: $e"
e=$(err verify --host -f "$work/nope/t.dat" --sizes 4K)
grep -qF "its folder $work/nope does not exist" <<<"$e" || fail "missing -f folder: $e"

# Without a GPU: the reason once, no errno text stacked on it, and what to do instead.
if ! "$gdskit" version | grep -q '^gpu: yes'; then
  v=$("$gdskit" version)
  once "$(grep "^gpu:" <<<"$v")" "libcuda.so.1"
  ! grep -q "cannot open shared object file" <<<"$v" || fail "the loader's words repeat the cause: $v"
  e=$(err load "$work/m.safetensors" --device 0)
  grep -q "^gdskit load: --device 0: no usable GPU: .*; --device cpu loads into host memory$" <<<"$e" ||
    fail "load --device 0: $e"
  ! grep -q "No such device" <<<"$e" || fail "load --device 0 said the cause twice: $e"
fi
echo "PASS messages"
