#!/usr/bin/env bash
# No hidden state: bench and verify neither start from learned shapes nor write them unless --learn asks (loads
# do, and GDSKIT_LEARN=off stops them); `gdskit tune --show` lists what the profile folder holds, per device,
# and `--forget` removes it and says what it removed (nothing to remove is no error).
# Usage: learn_state.sh <gdskit binary> <source dir> <build dir>
set -u
source "$(dirname "$0")/lib.bash" "$@"

mkdir -p "$work/d" "$work/cache"
export XDG_CACHE_HOME="$work/cache"
if ! dd if=/dev/zero of="$work/d/probe" bs=4096 count=1 oflag=direct status=none 2>/dev/null; then
  echo "skipped: $work refuses O_DIRECT"; exit 77
fi
rm -f "$work/d/probe"
folder="$work/cache/gdskit"

# A learned profile of the device under $work/d, as an earlier load would have left it: its identity is the one
# `gdskit tune` measures and names (measured, not saved).
tuned=$("$gdskit" tune --path "$work/d" --size 1M --no-write --no-save --json) || fail "tune: $tuned"
learned=$(python3 - "$tuned" "$folder" <<'PY'
import json, os, sys
p = json.loads(sys.argv[1])
d = p["device"]
name = "".join(c if c.isalnum() else "_" for c in (d["block"] or "dev"))
fnv = 1469598103934665603
for c in d["key"].encode():
    fnv = ((fnv ^ c) * 1099511628211) % (1 << 64)
os.makedirs(sys.argv[2], exist_ok=True)
path = os.path.join(sys.argv[2], f"learned-{name}-{fnv:016x}.json")
shape = {"depth": 3, "request_bytes": 2 << 20, "gib_per_s": 0.75, "updated": "2026-12-01T09:00:00Z"}
with open(path, "w") as f:
    json.dump({"version": 2, "device": d, "shapes": {"host-read": shape, "host-write": shape}}, f)
print(path)
PY
) || fail "could not write a learned profile"
block=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1])["device"]; print(d["block"] or d["key"])' "$tuned")
cp "$learned" "$work/learned.copy"
unchanged() {  # WHAT: the folder holds the learned file alone, as it was
  cmp -s "$learned" "$work/learned.copy" || fail "$1 rewrote the learned profile"
  [ "$(ls -A "$folder")" = "$(basename "$learned")" ] || fail "$1 wrote to the profile folder: $(ls -A "$folder")"
}

# A load starts from it (the reason names it)...
h='{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}'
printf "\\x$(printf %02x ${#h})\\0\\0\\0\\0\\0\\0\\0%s\\x2a" "$h" >"$work/d/one.safetensors"
plan=$("$gdskit" load -v "$work/d/one.safetensors" | grep '^path: ')
grep -q "O_DIRECT host reads: learned profile" <<<"$plan" || fail "load did not start from the learned shape: $plan"
plan=$(GDSKIT_LEARN=off "$gdskit" load -v "$work/d/one.safetensors" | grep '^path: ')
! grep -q "learned" <<<"$plan" || fail "GDSKIT_LEARN=off still read the learned profile: $plan"

# ... a verification does not, even with GDSKIT_LEARN=on, and writes nothing...
for env in "" "GDSKIT_LEARN=on"; do
  plan=$(env $env "$gdskit" verify --host -D "$work/d" --sizes 4K,1M -v | grep '^path: ') || fail "verify failed"
  grep -q "O_DIRECT host reads: no profile" <<<"$plan" && ! grep -q learned <<<"$plan" ||
    fail "verify ($env) started from the learned shape: $plan"
  unchanged "verify ($env)"
done
# ... unless --learn asks for it.
plan=$("$gdskit" verify --host -D "$work/d" --sizes 4K -v --learn | grep '^path: ')
grep -q "O_DIRECT host reads: learned profile" <<<"$plan" || fail "verify --learn ignored the learned shape: $plan"

# bench: no learning without --learn (said in its reasons when asked), nothing written either way here.
head -c 1048576 /dev/zero >"$work/d/data"
out=$("$gdskit" bench -f "$work/d/data" -s 1M --json) || fail "bench: $out"
! grep -q -- '--learn' <<<"$out" || fail "bench learns without --learn: $out"
unchanged bench
out=$("$gdskit" bench -f "$work/d/data" -s 1M --json --learn) || fail "bench --learn: $out"
grep -q -- '--learn: transfers start from learned shapes' <<<"$out" || fail "bench --learn does not say so: $out"

# tune --show: the file, its device, its shapes and when.
show=$("$gdskit" tune --show) || fail "tune --show: $show"
grep -qF "profile folder: $folder" <<<"$show" || fail "--show does not name the folder: $show"
grep -q "^$block" <<<"$show" || fail "--show does not name the device $block: $show"
grep -q "learned  host reads     depth  3 x 2.00 MiB      0.75 GiB/s  2026-12-01T09:00:00Z" <<<"$show" ||
  fail "--show does not list the shape: $show"
grep -qF "file $learned" <<<"$show" || fail "--show does not name the file: $show"
"$gdskit" tune --show --json | python3 -c '
import json, sys
j = json.load(sys.stdin)
(p,) = j["profiles"]
assert p["kind"] == "learned" and p["ignored"] is None, p
assert {s["name"] for s in p["shapes"]} == {"host reads", "host writes"}, p
' || fail "tune --show --json"

# tune --forget: by device name, then nothing left is no error; by the folder's device; --all.
out=$("$gdskit" tune --forget "$block") || fail "--forget $block: $out"
grep -qF "removed $learned" <<<"$out" && grep -q "forgot 1 profile file of $block" <<<"$out" || fail "--forget: $out"
[ ! -e "$learned" ] || fail "--forget left $learned"
out=$("$gdskit" tune --forget "$block") || fail "--forget with nothing to forget failed: $out"
grep -q "nothing learned or tuned for $block" <<<"$out" || fail "--forget with nothing to forget: $out"
cp "$work/learned.copy" "$learned"
out=$("$gdskit" tune --forget --path "$work/d") || fail "--forget --path: $out"
[ ! -e "$learned" ] || fail "--forget --path left $learned: $out"
cp "$work/learned.copy" "$learned"
expect 2 tune --forget "$block" --all
expect 2 tune --forget "$work/no/such/folder"
out=$("$gdskit" tune --forget --all --json) || fail "--forget --all: $out"
python3 -c 'import json,sys; j=json.loads(sys.argv[1]); assert len(j["removed"]) == 1, j' "$out" || fail "--all: $out"
[ -z "$(ls -A "$folder")" ] || fail "--forget --all left $(ls -A "$folder")"
show=$("$gdskit" tune --show)
grep -q "nothing learned or tuned" <<<"$show" || fail "--show of an empty folder: $show"
echo "PASS learn_state"
