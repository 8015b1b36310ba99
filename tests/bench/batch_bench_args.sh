#!/usr/bin/env bash
# batch_bench checks every case and row before it makes its data file: a bad case exits 2 and leaves nothing behind.
set -u
bin=$1
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
fail=0
for cases in "4K:64,5K:8" "4K:64,4K:0" "64K:64,128M:1" "4K:300"; do
  "$bin" "$d/data" 1G 1 "$cases" > "$d/out" 2>&1
  rc=$?
  if [ "$rc" -ne 2 ]; then echo "cases $cases: exit $rc, expected 2"; fail=1; fi
  if [ -e "$d/data" ]; then echo "cases $cases: the data file was made"; fail=1; rm -f "$d/data"; fi
  grep -q "bad case" "$d/out" || { echo "cases $cases: no reason given:"; cat "$d/out"; fail=1; }
done
# An unknown row is refused the same way, naming the rows there are.
"$bin" "$d/data" 1G 1 4K:8 --rows batch-gpu,nonsense > "$d/out" 2>&1
rc=$?
if [ "$rc" -ne 2 ]; then echo "--rows nonsense: exit $rc, expected 2"; fail=1; fi
if [ -e "$d/data" ]; then echo "--rows nonsense: the data file was made"; fail=1; fi
grep -q "no row 'nonsense' (wide, batch-host" "$d/out" || { echo "--rows nonsense: no reason given:"; cat "$d/out"; fail=1; }
exit $fail
