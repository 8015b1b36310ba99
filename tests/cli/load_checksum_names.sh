#!/usr/bin/env bash
# gdskit load --checksum prints tensor names escaped: a name holding a newline or ESC cannot forge a line of the
# report or drive the terminal.
# Usage: load_checksum_names.sh <gdskit binary> <source dir> <build dir>
set -u
gdskit=$1
[ -x "$gdskit" ] || { echo "no gdskit binary at $gdskit"; exit 77; }
command -v python3 >/dev/null || { echo "skipped: python3 not found"; exit 77; }
work=$(mktemp -d "${TMPDIR:-/tmp}/gdskit-load-cli.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# Two tensors; the second's name decodes to "a\n<fake sha>  forged  F32  [1]\x1b[2J".
python3 - "$work/m.safetensors" <<'PY' || fail "writing the file"
import json, struct, sys
forged = "a\n" + "0" * 64 + "  forged  F32  [1]\x1b[2J"
h = {"ok": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
     forged: {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}}
t = json.dumps(h).encode()
open(sys.argv[1], "wb").write(struct.pack("<Q", len(t)) + t + b"xy")
PY
out=$("$gdskit" load "$work/m.safetensors" --checksum) || fail "load: $out"
[ "$(grep -c '^[0-9a-f]\{64\}  ' <<<"$out")" = 2 ] || fail "expected two checksum lines: $out"
grep -q 'forged' <<<"$out" || fail "the escaped name is missing: $out"
if grep -q $'\x1b' <<<"$out"; then fail "raw ESC in the output"; fi
grep -qF 'a\n0000' <<<"$out" || fail "newline not shown as \\n: $out"
grep -qF '\x1b[2J' <<<"$out" || fail "ESC not shown as \\x1b: $out"
echo "PASS load_checksum_names"
