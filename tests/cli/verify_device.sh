#!/usr/bin/env bash
# gdskit verify never reports PASS for a GPU it did not test: without a usable GPU it stops with the reason (exit 2)
# unless --host asks for host memory. On a machine with a GPU it verifies GPU memory.
# Usage: verify_device.sh <gdskit binary> <source dir> <build dir>
set -u
source "$(dirname "$0")/lib.bash" "$@"

if "$gdskit" version | grep -q '^gpu: yes'; then
  out=$("$gdskit" verify -D "$work" --sizes 4K,1M+1 2>&1) || fail "verify on the GPU exited $?: $out"
  grep -q '^PASS: 2 sizes' <<<"$out" || fail "verify on the GPU: $out"
  grep -q 'host memory' <<<"$out" && fail "verify on a GPU machine tested host memory: $out"
else
  out=$("$gdskit" verify -D "$work" --sizes 4K 2>&1); rc=$?
  [ $rc -eq 2 ] || fail "verify without a GPU exited $rc, want 2: $out"
  grep -q 'no usable GPU' <<<"$out" || fail "no reason: $out"
  grep -q -- '--host' <<<"$out" || fail "the way out (--host) is not named: $out"
  grep -q PASS <<<"$out" && fail "verify without a GPU printed PASS: $out"
  json=$("$gdskit" verify -D "$work" --sizes 4K --json 2>/dev/null); rc=$?
  [ $rc -eq 2 ] || fail "verify --json without a GPU exited $rc"
fi
out=$("$gdskit" verify --host -D "$work" --sizes 4K,1M+1 2>&1) || fail "verify --host exited $?: $out"
grep -q '^PASS: 2 sizes' <<<"$out" || fail "verify --host: $out"
[ -z "$(ls "$work")" ] || fail "verify left files: $(ls "$work")"

# A test file that already exists is the user's: refused (exit 2), left as it was.
echo keep >"$work/mine"
expect 2 verify --host -f "$work/mine" --sizes 4K
[ "$(cat "$work/mine")" = keep ] || fail "verify touched an existing file"
# A size that cannot be allocated fails that size with the reason; the summary counts what passed.
out=$("$gdskit" verify --host -D "$work" --sizes 4K,1T 2>&1); rc=$?
[ $rc -ne 0 ] || fail "verify with an impossible size exited 0: $out"
grep -q '^FAIL: 1 of 2 sizes verified byte for byte' <<<"$out" || fail "summary after a failed size: $out"
grep -q 'could not allocate memory for 1.00 TiB' <<<"$out" || fail "allocation failure not explained: $out"
grep -q 'bad_alloc' <<<"$out" && fail "raw exception text: $out"
# A tensor-parallel world of 0 is refused in words.
err=$("$gdskit" load "$work/none.safetensors" --world 0 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q 'at least 1' <<<"$err" || fail "--world 0: $rc $err"
grep -q '1.79e308\|179769' <<<"$err" && fail "--world 0 prints the parser's range: $err"
echo "ok"
