#!/usr/bin/env bash
# gdskit bench end to end on host memory: write with -V, verified cold read, JSON, bad input and exit codes.
# Usage: bench_host.sh <gdskit binary> <source dir> <build dir>
set -u
gdskit=$1
[ -x "$gdskit" ] || { echo "no gdskit binary at $gdskit"; exit 77; }
work=$(mktemp -d "${TMPDIR:-/tmp}/gdskit-bench-cli.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

out=$("$gdskit" bench -f "$work/data" -s 2M -i 256K -w 4 -I 1 -V -k 3 --quiet -v) || fail "write run: $out"
grep -q '^IoType: WRITE XferType: CPUONLY Threads: 4 DataSetSize: 8192/8192(KiB) IOSize: 256(KiB) Throughput: ' <<<"$out" \
  || fail "gdsio line: $out"
grep -q 'created: *'"$work/data" <<<"$out" || fail "creation not reported: $out"
grep -q 'verify: *OK' <<<"$out" || fail "verify not reported: $out"
# A file the run creates is sized first, so its timed writes never extend it; the report says so.
grep -q 'sized to 8.00 MiB first (ftruncate)' <<<"$out" || fail "sizing not reported: $out"
[ "$(stat -c %s "$work/data")" -eq 8388608 ] || fail "size of the created file: $(stat -c %s "$work/data")"

out=$("$gdskit" bench -f "$work/data" -s 2M -i 256K -w 4 -I 0 -V -k 3 --cold --quiet -v) || fail "read run: $out"
grep -q '^IoType: READ' <<<"$out" || fail "read line: $out"
grep -q 'path: *host' <<<"$out" || fail "path: $out"
grep -q 'p50 .* p99 .* p999' <<<"$out" || fail "percentiles: $out"
grep -q 'CPU-s per GiB' <<<"$out" || fail "cpu: $out"

json=$("$gdskit" bench -f "$work/data" -s 2M -i 256K -w 2 --json --quiet) || fail "json run"
python3 - "$json" <<'PY' || fail "json"
import json, sys
d = json.loads(sys.argv[1])
r = d["results"][0]
assert r["io_type"] == "READ" and r["path"]["ran"] == "host" and r["throughput_gib_s"] > 0, r
# Without -V nothing was verified: the report says it did not run and claims no verdict.
assert r["verify"] == {"ran": False, "ok": None, "bytes": 0, "message": ""}, r["verify"]
PY

# The batched host type: each worker submits -B ranges to the batch core at once; written and read back byte for
# byte (sequential and random offsets, odd -B, variable sizes), the routes and the batch size reported.
out=$("$gdskit" bench -f "$work/batch" -s 3M -i 4K:64K:4K -w 3 -I 3 -x host-batch -B 7 -V -k 9 --quiet -v) \
  || fail "batched random write: $out"
grep -q '^IoType: RANDWRITE XferType: CPU_BATCH Threads: 3 ' <<<"$out" || fail "batched gdsio line: $out"
grep -q 'verify: *OK' <<<"$out" || fail "batched write not verified: $out"
grep -q 'path: *host (asked -x host-batch): batch core: [0-9]* batches of up to 7 ranges; ranges by route: host [1-9]' \
  <<<"$out" || fail "batched path: $out"
# A random read with the same -k replays the random write's ranges, redrawn where they overlapped, and checks them.
out=$("$gdskit" bench -f "$work/batch" -s 3M -i 4K:64K:4K -w 3 -I 2 -x host-batch -B 7 -V -k 9 --quiet) \
  || fail "batched random read of the random write: $out"
out=$("$gdskit" bench -f "$work/batch" -s 3M -i 64K -w 3 -I 1 -x host-batch -B 5 -V -k 9 --quiet) \
  || fail "batched sequential write: $out"
json=$("$gdskit" bench -f "$work/batch" -s 3M -i 64K -w 3 -I 0 -x host-batch -B 5 -V -k 9 --cold --json --quiet) \
  || fail "batched verified read: $json"
python3 - "$json" <<'PY' || fail "batched json"
import json, sys
r = json.loads(sys.argv[1])["results"][0]
b = r["batch"]
assert r["verify"]["ok"] and r["verify"]["bytes"] == 3 * 3 * 2**20, r["verify"]
assert b["ranges_per_batch"] == 5 and b["ranges_by_route"]["host"] == r["ops"] == 3 * 48, b
assert b["batches"] == 3 * 10 and not b["stream_ordered"] and r["path"]["ran"] == "host", b
PY
# Corrupt the file: the batched read's verification fails (exit 1) and names the offset.
printf 'XXXX' | dd of="$work/batch" bs=1 seek=1234567 conv=notrunc status=none
out=$("$gdskit" bench -f "$work/batch" -s 3M -i 64K -w 3 -I 0 -x host-batch -B 5 -V -k 9 --quiet 2>&1)
[ $? -eq 1 ] && grep -q 'mismatch in .* at offset 123456[7-9]\|at offset 1234570' <<<"$out" \
  || fail "corruption not found by the batched read: $out"
if ! nvidia-smi >/dev/null 2>&1; then
  err=$("$gdskit" bench -f "$work/batch" -s 1M -i 64K -x 6 -B 8 2>&1 >/dev/null); rc=$?
  [ $rc -eq 2 ] && grep -q 'needs a GPU' <<<"$err" || fail "-x 6 without a GPU: $rc $err"
  err=$("$gdskit" bench -f "$work/batch" -s 1M -i 64K -x 7 -B 8 2>&1 >/dev/null); rc=$?
  [ $rc -eq 2 ] && grep -q -- '-x 7 (batch-stream) needs a GPU' <<<"$err" || fail "-x 7 not named as asked: $rc $err"
fi
err=$("$gdskit" bench -f "$work/batch" -s 1M -x bogus 2>&1 >/dev/null); rc=$?
[ $rc -eq 2 ] && grep -q 'host-batch' <<<"$err" || fail "unknown -x does not list the batch types: $rc $err"
err=$("$gdskit" bench -f "$work/batch" -s 1M -x host-batch -B 18446744073709551616 2>&1 >/dev/null); rc=$?
[ $rc -eq 2 ] && grep -q 'must be between' <<<"$err" || fail "-B past 2^64: $rc $err"

# Wrong seed: verification fails with exit code 1.
"$gdskit" bench -f "$work/data" -s 2M -i 256K -w 4 -I 0 -V -k 4 --quiet >/dev/null 2>&1
[ $? -eq 1 ] || fail "wrong seed should exit 1"

# Bad input: exit code 2, a reason, nothing written.
before=$(ls "$work")
for args in "-f $work/missing -s 1M" "-f $work/data -s 64M" "-f $work/new -s 1M -i 0 -I 1" \
            "-f $work/new -s 1M -I 1 -x gds" "-f $work/new -s 1M -I 1 -x 2 -d 99" \
            "-f $work/no/such/dir/f -s 1M -I 1" "-f $work/data -s 1M -w 0" "-f $work/data -s 1M -Q 1"; do
  err=$("$gdskit" bench $args 2>&1 >/dev/null)
  rc=$?
  [ $rc -eq 2 ] || fail "'$args' exited $rc, want 2"
  [ -n "$err" ] || fail "'$args' printed no reason"
done
[ "$(ls "$work")" = "$before" ] || fail "bad input wrote files: $(ls "$work")"

"$gdskit" bench -h | grep -q 'CPU_ASYNC_GPU->staged' || fail "help"
echo "ok"
