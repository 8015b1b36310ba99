#!/usr/bin/env bash
# gdskit load --save end to end on host memory: a file written by an independent writer of the format comes back
# byte for byte, sharded saves, --force, --json and a bad --max-shard-size.
# Usage: load_save.sh <gdskit binary> <source dir> <build dir>
set -u
source "$(dirname "$0")/lib.bash" "$@"
py=/usr/bin/python3
[ -x "$py" ] || py=python3

# A file in the layout safetensors writes: descending dtype alignment then name, compact JSON, space padding.
"$py" - "$work/in.safetensors" <<'PY' || fail "writing the input"
import json, os, struct, sys
rank = ["BOOL", "U8", "I8", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64", "F64", "I64", "U64"]
size = {"BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4,
        "C64": 8, "F64": 8, "I64": 8, "U64": 8}
tensors = {f"{d.lower()}.w": (d, [3, 5]) for d in rank}
tensors["big"] = ("F32", [1000, 777])
tensors["scalar"] = ("F64", [])
tensors["empty"] = ("F16", [0, 4])
order = sorted(tensors, key=lambda n: (-rank.index(tensors[n][0]), n.encode()))
h, data = {"__metadata__": {"format": "pt"}}, b""
for n in order:
    d, shape = tensors[n]
    k = size[d]
    for s in shape:
        k *= s
    h[n] = {"dtype": d, "shape": shape, "data_offsets": [len(data), len(data) + k]}
    data += os.urandom(k)
t = json.dumps(h, separators=(",", ":")).encode()
t += b" " * ((8 - len(t) % 8) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(t)) + t + data)
PY

out=$("$gdskit" load "$work/in.safetensors" --save "$work/out.safetensors") || fail "load --save: $out"
cmp "$work/in.safetensors" "$work/out.safetensors" || fail "the saved file differs from the input"
grep -q '^saved .* GiB/s' <<<"$out" || fail "no save rate: $out"
grep -q '^loaded .* GiB/s' <<<"$out" || fail "no load rate: $out"

"$gdskit" load "$work/in.safetensors" --save "$work/out.safetensors" >/dev/null 2>"$work/err" && fail "replaced without --force"
# Said with the flag that replaces it, and exit 2 (bad input).
grep -q -- '--save "'"$work"'/out.safetensors": exists; --force replaces it' "$work/err" || fail "EEXIST: $(cat "$work/err")"
expect 2 load "$work/in.safetensors" --save "$work/out.safetensors"
"$gdskit" load "$work/in.safetensors" --save "$work/out.safetensors" --force >/dev/null || fail "--force"
cmp "$work/in.safetensors" "$work/out.safetensors" || fail "--force wrote other bytes"

json=$("$gdskit" load "$work/in.safetensors" --save "$work/ckpt" --max-shard-size 1MB --json) || fail "sharded: $json"
"$py" - "$json" "$work/ckpt" <<'PY' || fail "sharded json or index"
import json, os, sys
d = json.loads(sys.argv[1])
s = d["save"]
assert s["sharded"] and s["gib_per_s"] > 0 and d["gib_per_s"] > 0, s
names = sorted(os.listdir(sys.argv[2]))
assert names[-1] == "model.safetensors.index.json" and len(names) >= 3, names
assert s["files"][-1].endswith("model.safetensors.index.json"), s["files"]
idx = json.load(open(os.path.join(sys.argv[2], "model.safetensors.index.json")))
assert idx["metadata"]["total_size"] == s["tensor_bytes"], (idx["metadata"], s)
assert idx["weight_map"]["big"] != idx["weight_map"]["f32.w"], "the 3 MB tensor shares a 1 MB shard"
PY
"$gdskit" load "$work/ckpt" --save "$work/again.safetensors" >/dev/null || fail "loading the sharded checkpoint back"
cmp "$work/in.safetensors" "$work/again.safetensors" || fail "sharded round trip changed bytes"

expect 2 load "$work/in.safetensors" --save "$work/x" --max-shard-size 5XB  # bad input (docs/cli.md)
[ ! -e "$work/x" ] || fail "bad --max-shard-size created $work/x"
ls "$work" | grep -q 'gdskit-tmp' && fail "temporary files left: $(ls "$work")"
exit 0
