#!/usr/bin/env bash
# gdskit load on hostile indexes: names and file names from an index reach the error escaped (no raw ESC, BEL,
# C1 control or newline on the terminal), an index nested beyond the bound is refused as bad input, and a save
# over a folder whose old index is nested a million levels deep replaces it without a crash or leftovers.
# Usage: load_hostile_index.sh <gdskit binary> <source dir> <build dir>
set -u
gdskit=$1
[ -x "$gdskit" ] || { echo "no gdskit binary at $gdskit"; exit 77; }
command -v python3 >/dev/null || { echo "skipped: python3 not found"; exit 77; }
work=$(mktemp -d "${TMPDIR:-/tmp}/gdskit-load-hostile.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

python3 - "$work" <<'PY' || fail "writing the files"
import json, os, struct, sys
d = sys.argv[1]
h = {"w": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}
t = json.dumps(h).encode()
open(os.path.join(d, "a.safetensors"), "wb").write(struct.pack("<Q", len(t)) + t + b"xy")
evil = "k\x1b]0;owned\x07\x1b[2J\n\u009b"
cases = {
    "not-string": {"weight_map": {evil: 5}},
    "leaves": {"weight_map": {evil: "../a.safetensors"}},
    "lacks": {"weight_map": {evil: "a.safetensors"}},
    "missing": {"weight_map": {"w": evil + ".safetensors"}},
}
for name, j in cases.items():
    os.makedirs(os.path.join(d, name))
    open(os.path.join(d, name, "a.safetensors"), "wb").write(struct.pack("<Q", len(t)) + t + b"xy")
    with open(os.path.join(d, name, "model.safetensors.index.json"), "w") as f:
        json.dump(j, f)
deep = os.path.join(d, "deep")
os.makedirs(deep)
with open(os.path.join(deep, "model.safetensors.index.json"), "w") as f:
    f.write('{"metadata": ' + "[" * 1000000 + "]" * 1000000 + ', "weight_map": {"w": "../a.safetensors"}}')
PY

for c in not-string leaves lacks missing; do
  err=$("$gdskit" load "$work/$c" 2>&1 >/dev/null)
  rc=$?
  [ "$rc" -ne 0 ] || fail "$c: loaded"
  printf '%s' "$err" | grep -q $'[\x1b\x07]' && fail "$c: raw ESC or BEL in: $err"
  printf '%s' "$err" | grep -q $'\xc2\x9b' && fail "$c: raw C1 control in: $err"
  [ "$(printf '%s\n' "$err" | wc -l)" = 1 ] || fail "$c: the message spans lines: $err"
  grep -qF '\x1b]0;owned\a\x1b[2J\n\u009b' <<<"$err" || fail "$c: the escaped text is missing: $err"
done

err=$("$gdskit" load "$work/deep" 2>&1 >/dev/null)
rc=$?
[ "$rc" = 2 ] || fail "deep index: exit $rc (want 2, bad input): $err"
grep -q "nested more than 64 levels" <<<"$err" || fail "deep index: $err"

# A save over a folder whose index is nested a million levels deep (and names its shards) replaces it cleanly.
out="$work/out"
"$gdskit" load "$work/a.safetensors" --save "$out/" --max-shard-size 1 >/dev/null 2>&1 || fail "first save"
python3 - "$out" <<'PY' || fail "deepening the index"
import json, os, sys
p = os.path.join(sys.argv[1], "model.safetensors.index.json")
if os.path.exists(p):
    j = json.load(open(p))
else:  # one shard, no index: write one that names it
    j = {"weight_map": {"w": "model.safetensors"}}
text = json.dumps(j)
open(p, "w").write(text[:-1] + ', "x": ' + "[" * 1000000 + "]" * 1000000 + "}")
PY
err=$("$gdskit" load "$work/a.safetensors" --save "$out/" --force 2>&1 >/dev/null) || fail "save over a deep index: $err"
left=$(ls -A "$out" | grep -E 'gdskit-old|gdskit-tmp') && fail "left behind: $left"
"$gdskit" load "$out" >/dev/null 2>&1 || fail "the new checkpoint does not load"
echo "PASS load_hostile_index"
