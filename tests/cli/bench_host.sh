#!/usr/bin/env bash
# gdskit bench end to end on host memory: write with -V, verified cold read, JSON, bad input and exit codes.
# Usage: bench_host.sh <gdskit binary> <source dir> <build dir>
set -u
gdskit=$1
[ -x "$gdskit" ] || { echo "no gdskit binary at $gdskit"; exit 77; }
work=$(mktemp -d "${TMPDIR:-/tmp}/gdskit-bench-cli.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

out=$("$gdskit" bench -f "$work/data" -s 2M -i 256K -w 4 -I 1 -V -k 3 --quiet) || fail "write run: $out"
grep -q '^IoType: WRITE XferType: CPUONLY Threads: 4 DataSetSize: 8192/8192(KiB) IOSize: 256(KiB) Throughput: ' <<<"$out" \
  || fail "gdsio line: $out"
grep -q 'created: *'"$work/data" <<<"$out" || fail "creation not reported: $out"
grep -q 'verify: *OK' <<<"$out" || fail "verify not reported: $out"
# A file the run creates is sized first, so its timed writes never extend it; the report says so.
grep -q 'sized to 8.00 MiB first (ftruncate)' <<<"$out" || fail "sizing not reported: $out"
[ "$(stat -c %s "$work/data")" -eq 8388608 ] || fail "size of the created file: $(stat -c %s "$work/data")"

out=$("$gdskit" bench -f "$work/data" -s 2M -i 256K -w 4 -I 0 -V -k 3 --cold --quiet) || fail "read run: $out"
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
PY

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
