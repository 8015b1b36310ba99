#!/usr/bin/env bash
# gdskit bench kv end to end on a small store: every phase runs, the JSON holds the figures and the checks
# (no wrong bytes, no hangs, capacity kept), the bench cleans up after itself, and bad flags exit 2.
# Usage: kv_bench.sh <gdskit binary> <source dir> <build dir>
source "$(dirname "$0")/lib.bash"

json=$("$gdskit" bench kv --dir "$work" --capacity 24M --block-sizes 64K --seconds 0.3 --kills 1 --threads 2 \
  --json 2>"$work/err") || fail "bench kv exited $?: $(cat "$work/err")"
python3 - "$json" <<'PY' || fail "bench kv JSON"
import json, sys
d = json.loads(sys.argv[1])
assert d["ok"] is True, d
assert d["in_flight"] == 2 and d["threads"] == 2, d
run = d["runs"][0]
assert run["block_bytes"] == 65536 and run["slots"] > 0 and run["capacity_kept"], run
assert run["raw"]["read_gib_per_s"] > 0 and run["raw"]["fresh_write_gib_per_s"] > 0, run["raw"]
assert all(run["raw"][k] in (8, 16, 64) for k in ("fresh_write_depth", "write_depth", "read_depth")), run["raw"]
phases = {p["name"]: p for p in run["phases"]}
for name in ("put storm", "cold get", "mix", "churn", "faults", "kill -9 + reopen", "baseline put", "baseline get"):
    assert name in phases, (name, sorted(phases))
for p in phases.values():
    assert p["wrong_bytes"] == 0 and p["hangs"] == 0, p
assert phases["put storm"]["stored"] > 0 and phases["cold get"]["hits"] > 0
assert phases["put storm"]["latency_ms"]["p999"] >= phases["put storm"]["latency_ms"]["p50"] > 0
assert phases["mix"]["bytes_written_per_hit"] >= 0 and 0 <= phases["mix"]["hit_ratio"] <= 1
f = phases["faults"]
assert f["enospc_puts"]["stored"] == 0 and f["enospc_puts"]["keys"] > 0, f
assert f["gets_while_full"]["hits"] > 0, f
assert f["eio_gets"]["hits"] == 0, f
b = phases["baseline put"]
assert b["writeback_seconds"] >= 0, b
assert 0 < b["gib_per_s_with_writeback"] <= b["gib_per_s"], b
c = phases["kill -9 + reopen"]
assert c["kills"][0]["capacity_kept"] and c["wrong_bytes"] == 0, c
PY
# Blocking calls, one per caller: the same checks hold.
json=$("$gdskit" bench kv --dir "$work" --capacity 24M --block-sizes 64K --seconds 0.3 --mix put,get --in-flight 1 \
  --json 2>"$work/err") || fail "bench kv --in-flight 1 exited $?: $(cat "$work/err")"
python3 - "$json" <<'PY' || fail "bench kv --in-flight 1 JSON"
import json, sys
d = json.loads(sys.argv[1])
assert d["ok"] is True and d["in_flight"] == 1, d
phases = {p["name"]: p for p in d["runs"][0]["phases"]}
assert phases["put storm"]["stored"] > 0 and phases["cold get"]["hits"] > 0, phases
PY
leftover=$(ls "$work" | grep -v '^err$')
[ -z "$leftover" ] || fail "the bench left files behind: $leftover"

out=$("$gdskit" bench kv --help) || fail "--help"
grep -q -- '--block-sizes' <<<"$out" || fail "--help lists no --block-sizes: $out"
grep -q 'Exit codes' <<<"$out" || fail "--help has no exit codes: $out"

expect 2 bench kv
expect 2 bench kv --dir "$work/missing"
expect 2 bench kv --dir "$work" --mix puts
expect 2 bench kv --dir "$work" --block-sizes 0
expect 2 bench kv --dir "$work" --capacity 100K
expect 2 bench kv --dir "$work" --durability sometimes
expect 2 bench kv --dir "$work" --threads 0
expect 2 bench kv --dir "$work" --in-flight 0
expect 2 bench kv --dir "$work" --in-flight 17
expect 2 bench kv --dir "$work" --jsn
expect 2 bench kv --dir "$work" --block-sizes 64K,,2M
expect 2 bench kv --dir "$work" --mix put,
# A GPU index runs from 0: a negative number is refused naming the flag, never run silently in host memory (-1 is
# the option's own "host memory" inside).
for gpu in -5 -1 1024; do
  err=$("$gdskit" bench kv --dir "$work" --capacity 24M --block-sizes 64K --seconds 0.3 --mix put --gpu $gpu 2>&1 \
    >/dev/null); rc=$?
  [ $rc -eq 2 ] && grep -qF "gdskit bench kv: --gpu: '$gpu' is out of range (0 .. 1023)" <<<"$err" ||
    fail "--gpu $gpu: exit $rc: $err"
done
[ -z "$(ls "$work" | grep -v '^err$')" ] || fail "a refused run wrote something"

# Folders are checked before anything runs: the same folder twice (also through a link), someone's files under
# the bench's names (never removed or overwritten), more capacity than the folder has room for.
ln -s "$work" "$work/../kv-link-$$"
expect 2 bench kv --dir "$work" --dir "$work/../kv-link-$$" --capacity 24M --block-sizes 64K
rm -f "$work/../kv-link-$$"
mkdir "$work/gdskit-kv-bench-store-65536"
echo "someone's" > "$work/gdskit-kv-bench-store-65536/notes"
err=$("$gdskit" bench kv --dir "$work" --capacity 24M --block-sizes 64K --seconds 0.3 --mix put 2>&1 >/dev/null)
[ $? -eq 2 ] || fail "a folder holding the bench's names was used: $err"
grep -q "remove it first" <<<"$err" || fail "no reason for refusing the folder: $err"
[ "$(cat "$work/gdskit-kv-bench-store-65536/notes")" = "someone's" ] || fail "someone's file was touched"
rm -rf "$work/gdskit-kv-bench-store-65536"
expect 2 bench kv --dir "$work" --capacity 18446744073709551615 --block-sizes 64K
expect 2 bench kv --dir "$work" --capacity 1E --block-sizes 64K

# SIGTERM in the middle of a run: it says so, exits 143 and leaves nothing behind.
"$gdskit" bench kv --dir "$work" --capacity 256M --block-sizes 64K --seconds 2 --mix put,get >/dev/null 2>"$work/err" &
pid=$!
for _ in $(seq 1 300); do grep -q "put storm" "$work/err" && break; sleep 0.05; done
kill -TERM $pid
wait $pid
rc=$?
[ $rc -eq 143 ] || fail "an interrupted bench kv exited $rc: $(cat "$work/err")"
grep -q "interrupted" "$work/err" || fail "an interrupted bench kv said nothing: $(cat "$work/err")"
[ -z "$(ls "$work" | grep -v '^err$')" ] || fail "an interrupted run left files: $(ls "$work")"
echo "PASS bench kv"
