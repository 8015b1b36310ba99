#!/usr/bin/env bash
# The patch's note on what it does not prove: always in --help, in text output once per terminal session (a
# marker under $XDG_RUNTIME_DIR/gdskit, else the cache folder), never in --json.
# Usage: patch_note.sh <gdskit binary> <source dir> <build dir>
set -u
source "$(dirname "$0")/lib.bash" "$@"
tree=$2/tests/fixtures/patch/v580
[ -d "$tree" ] || { echo "skipped: no fixture tree $tree"; exit 77; }
note='What it does not prove'
mkdir -p "$work/run" "$work/cache"
export XDG_RUNTIME_DIR="$work/run" XDG_CACHE_HOME="$work/cache"
count() { grep -c "$note" <<<"$1"; }

# The first patch command of this session prints it; later ones, of any subcommand, do not.
out=$("$gdskit" patch check --src "$tree" 2>&1) || fail "patch check: $out"
[ "$(count "$out")" -eq 1 ] || fail "the first patch command of the session did not print the note: $out"
out=$("$gdskit" patch check --src "$tree" 2>&1)
[ "$(count "$out")" -eq 0 ] || fail "the note was printed twice in one session: $out"
out=$("$gdskit" patch registry-dwords --driver-version 580.95.05 2>&1)
[ "$(count "$out")" -eq 0 ] || fail "registry-dwords printed the note again: $out"
[ -n "$(ls -A "$work/run/gdskit")" ] || fail "no marker under \$XDG_RUNTIME_DIR/gdskit"

# Another session (setsid: a new terminal's shell) sees it once again.
if command -v setsid >/dev/null; then
  out=$(setsid -w "$gdskit" patch check --src "$tree" 2>&1)
  [ "$(count "$out")" -eq 1 ] || fail "a new session did not print the note: $out"
fi

# --help always has it; --json never.
for args in "patch --help" "patch check --help" "patch registry-dwords --help"; do
  out=$("$gdskit" $args 2>&1)
  [ "$(count "$out")" -eq 1 ] || fail "gdskit $args lacks the note: $out"
done
rm -rf "$work/run/gdskit"
out=$("$gdskit" patch check --src "$tree" --json 2>&1)
[ "$(count "$out")" -eq 0 ] || fail "--json carries the note: $out"
python3 -c 'import json,sys; json.loads(sys.stdin.read())' <<<"$out" || fail "--json is not JSON alone: $out"

# Without XDG_RUNTIME_DIR the marker lives in the cache folder.
out=$(env -u XDG_RUNTIME_DIR "$gdskit" patch check --src "$tree" 2>&1)
[ "$(count "$out")" -eq 1 ] || fail "first, cache folder: $out"
out=$(env -u XDG_RUNTIME_DIR "$gdskit" patch check --src "$tree" 2>&1)
[ "$(count "$out")" -eq 0 ] || fail "second, cache folder: $out"
[ -n "$(ls -A "$work/cache/gdskit/sessions")" ] || fail "no marker in the cache folder"
echo "PASS patch_note"
