#!/usr/bin/env bash
# gdskit tune: bad input is exit 2 with a reason and leaves nothing behind; a small sweep writes a profile that
# loads (version 1, this device), removes its temporary file, and a damaged profile is reported by the doctor.
# Usage: tune.sh <gdskit binary> <source dir> <build dir>
set -u
source "$(dirname "$0")/lib.bash"

expect 2 tune --size 10
expect 2 tune --path "$work/missing" --size 4M --no-save
mkdir -p "$work/d" "$work/cache"
# O_DIRECT is needed: skip where the temporary folder refuses it (tmpfs).
if ! dd if=/dev/zero of="$work/d/probe" bs=4096 count=1 oflag=direct status=none 2>/dev/null; then
  echo "skipped: $work refuses O_DIRECT"; exit 77
fi
rm -f "$work/d/probe"
out=$(XDG_CACHE_HOME="$work/cache" "$gdskit" tune --path "$work/d" --size 4M --json) || fail "tune: $out"
python3 - "$out" <<'PY' || fail "profile JSON: $out"
import json, sys
p = json.loads(sys.argv[1])
assert p["version"] == 1, p
assert p["read"]["depth"] >= 1 and p["read"]["request_bytes"] % 4096 == 0, p
assert len(p["sweep"]) == 48, len(p["sweep"])
PY
[ -z "$(ls -A "$work/d")" ] || fail "tune left files behind: $(ls -A "$work/d")"
prof=$(ls "$work/cache/gdskit/"profile-*.json) || fail "no profile saved"
doc=$(XDG_CACHE_HOME="$work/cache" "$gdskit" doctor --path "$work/d" 2>&1)
grep -q "device profile" <<<"$doc" || fail "doctor does not show the profile: $doc"
echo '{"version": 99}' > "$prof"
doc=$(XDG_CACHE_HOME="$work/cache" "$gdskit" doctor --path "$work/d" 2>&1)
grep -q "profile ignored" <<<"$doc" || fail "doctor does not say why the profile is ignored: $doc"
echo "PASS tune"
