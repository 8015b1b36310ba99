#!/usr/bin/env bash
# gdskit doctor on every root of the corpus of reported failures (tests/fixtures/systems/corpus): the exit code and
# the JSON verdict match the README's expectation, and no root is called "true GDS" unless its README says so.
# Usage: doctor_corpus.sh <gdskit binary> <source dir> <build dir>
set -u
source "$(dirname "$0")/lib.bash" "$@"
src=$2
n=0
for root in "$src"/tests/fixtures/systems/corpus/*/; do
  root=${root%/}
  want=$(sed -n 's/^verdict: //p' "$root/README.md")
  [ -n "$want" ] || fail "$root: README without a verdict line"
  out=$(timeout 30 "$gdskit" doctor --root "$root" --no-color --json 2>"$work/err")
  rc=$?
  got=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["verdict"]["kind"])' <<<"$out") ||
    fail "$root: not JSON (exit $rc): $(cat "$work/err")"
  [ "$got" = "$want" ] || fail "$root: verdict $got, want $want"
  if [ "$want" = true_gds ]; then [ "$rc" -eq 0 ] || fail "$root: exit $rc for true GDS"
  else [ "$rc" -eq 1 ] || fail "$root: exit $rc, want 1"; fi
  n=$((n + 1))
done
[ "$n" -ge 15 ] || fail "only $n corpus roots"
echo "ok ($n roots)"
