#!/usr/bin/env bash
# batch_bench checks every case, row and option before it makes its data file: a bad one exits 2 and leaves nothing
# behind.
set -u
bin=$1
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
fail=0
# refused LABEL REASON ARGS...: batch_bench ARGS exits 2, makes no data file and says REASON (a fixed string).
refused() {
  local label=$1 reason=$2
  shift 2
  "$bin" "$@" > "$d/out" 2>&1
  local rc=$?
  if [ "$rc" -ne 2 ]; then echo "$label: exit $rc, expected 2"; fail=1; fi
  if [ -e "$d/data" ]; then echo "$label: the data file was made"; fail=1; rm -f "$d/data"; fi
  grep -qF -- "$reason" "$d/out" || { echo "$label: no reason given:"; cat "$d/out"; fail=1; }
}
for cases in "4K:64,5K:8" "4K:64,4K:0" "64K:64,128M:1" "4K:300"; do
  refused "cases $cases" "bad case" "$d/data" 1G 1 "$cases"
done
# An unknown row is refused the same way, naming the rows there are.
refused "--rows nonsense" "no row 'nonsense' (wide, batch-host" "$d/data" 1G 1 4K:8 --rows batch-gpu,nonsense
# So is a number of turns that is missing, not a whole number or outside 1..20.
refused "--turns" "--turns needs a number" "$d/data" 1G 1 4K:8 --turns
for turns in 0 21 x 3x; do
  refused "--turns $turns" "--turns: '$turns' is not a number" "$d/data" 1G 1 4K:8 --turns "$turns"
done
# Options right after SIZE: their values are never read as SECONDS or CASES.
refused "--turns after SIZE" "--turns: '0' is not a number" "$d/data" 1G --turns 0
refused "an argument past CASES" "unexpected argument 'extra'" "$d/data" 1G 1 4K:8 extra
# A real pass of two turns with the host rows only (no GPU needed, about 2 s): each JSON row counts its turns and
# gives each turn's rate, and the ratio line each turn's ratio. O_DIRECT needs a filesystem that has it (tmpfs of
# older kernels has not); where the temporary folder's lacks it, this part is skipped.
if dd if=/dev/zero of="$d/probe" bs=4096 count=1 oflag=direct status=none 2> /dev/null; then
  "$bin" "$d/data" 8M 0.2 64K:4 --turns 2 --rows batch-host --json "$d/out.json" > "$d/out" 2>&1
  rc=$?
  if [ "$rc" -ne 0 ]; then echo "--turns 2: exit $rc:"; cat "$d/out"; fail=1; fi
  rows=$(grep -cE '"turns": 2, "turn_gib_s": \[[0-9.]+, [0-9.]+\]\}' "$d/out.json" 2> /dev/null)
  if [ "${rows:-0}" -ne 2 ]; then
    echo "--turns 2: ${rows:-0} of 2 JSON rows with two turns:"; cat "$d/out.json"; fail=1
  fi
  grep -qE '^  batch host: [0-9.]+ of the ring.s rate \[turns [0-9.]+ [0-9.]+\], p99.9' "$d/out" ||
    { echo "--turns 2: no ratio line with each turn's:"; cat "$d/out"; fail=1; }
else
  echo "skipped the pass of two turns: ${TMPDIR:-/tmp} has no O_DIRECT"
fi
exit $fail
