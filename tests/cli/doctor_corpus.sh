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
  # The first failing layer, the check that names the cause and the words a user would recognise.
  layer=$(sed -n 's/^first failing layer: //p' "$root/README.md")
  check=$(sed -n 's/^check: //p' "$root/README.md")
  says=$(sed -n 's/^says: //p' "$root/README.md")
  [ -n "$layer" ] && [ -n "$check" ] && [ -n "$says" ] || fail "$root: README lacks the layer, check or words"
  got_layer=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["verdict"].get("first_failing_layer") or "-")' \
    <<<"$out")
  [ "$got_layer" = "$layer" ] || fail "$root: first failing layer $got_layer, want $layer"
  grep -qF -- "\"$check" <<<"$out" || fail "$root: no finding of check $check"
  grep -qiF -- "$says" <<<"$out" || fail "$root: the report does not say \"$says\""
  if [ "$want" = true_gds ]; then [ "$rc" -eq 0 ] || fail "$root: exit $rc for true GDS"
  else [ "$rc" -eq 1 ] || fail "$root: exit $rc, want 1"; fi
  n=$((n + 1))
done
[ "$n" -ge 15 ] || fail "only $n corpus roots"
echo "ok ($n roots)"

# A machine without a usable NVIDIA GPU gets a few lines (that first, what to fix, --all for the layers);
# --all and --json still give every layer, and a machine with a GPU always does.
short=$("$gdskit" doctor --root "$src/tests/fixtures/systems/corpus/case-16" --no-color)
[ $? -eq 1 ] || fail "no-GPU root: exit code"
[ "$(wc -l <<<"$short")" -le 8 ] || fail "no-GPU report is $(wc -l <<<"$short") lines: $short"
head -1 <<<"$short" | grep -q '^No usable NVIDIA GPU here' || fail "no-GPU report does not say so first: $short"
grep -q 'version magic' <<<"$short" || fail "no-GPU report hides the cause: $short"
grep -q -- '--all' <<<"$short" || fail "no-GPU report does not point at --all: $short"
full=$("$gdskit" doctor --root "$src/tests/fixtures/systems/corpus/case-16" --no-color --all)
grep -q 'storage.mount' <<<"$full" || fail "--all does not show every layer"
"$gdskit" doctor --root "$src/tests/fixtures/systems/corpus/case-16" --json | grep -q '"storage.mount"' || fail "--json lost layers"
"$gdskit" doctor --root "$src/tests/fixtures/systems/gds-ok-nvme-ext4" --no-color | grep -q 'storage.mount' ||
  fail "a machine with a GPU lost its layers"
echo "ok (short report without a GPU)"
