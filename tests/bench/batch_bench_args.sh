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
refused "--peer missing" "--peer needs a program" "$d/data" 1G 1 4K:8 --peer
refused "--peer not a program" "is not an executable file" "$d/data" 1G 1 4K:8 --peer "$d"
for t in "" 0 3601 x; do
  refused "--peer-timeout '$t'" "--peer-timeout needs a number of seconds" "$d/data" 1G 1 4K:8 --peer-timeout $t
done
refused "an argument past CASES" "unexpected argument 'extra'" "$d/data" 1G 1 4K:8 extra
# A real pass of two turns with the host rows only (no GPU needed, about 2 s): each JSON row counts its turns and
# gives each turn's rate, and the ratio line each turn's ratio. O_DIRECT needs a filesystem that has it (tmpfs of
# older kernels has not); where the temporary folder's lacks it, this part is skipped.
if dd if=/dev/zero of="$d/probe" bs=4096 count=1 oflag=direct status=none 2> /dev/null; then
  "$bin" "$d/data" 8M 0.2 64K:4 --turns 2 --rows batch-host --json "$d/out.json" > "$d/out" 2>&1
  rc=$?
  if [ "$rc" -ne 0 ]; then echo "--turns 2: exit $rc:"; cat "$d/out"; fail=1; fi
  rows=$(grep -cE '"turns": 2, "turn_gib_s": \[[0-9.]+, [0-9.]+\](, "requests_per_range": [0-9.]+)?\}' "$d/out.json" 2> /dev/null)
  if [ "${rows:-0}" -ne 2 ]; then
    echo "--turns 2: ${rows:-0} of 2 JSON rows with two turns:"; cat "$d/out.json"; fail=1
  fi
  # The batch's requests are counted (its ranges lie apart: one request each, as the ring reads them); the
  # ring's are not.
  grep -qE '"what": "batch host", .*"requests_per_range": 1\.0000\}' "$d/out.json" &&
    ! grep -qE '"what": "ring", .*requests_per_range' "$d/out.json" ||
    { echo "--turns 2: requests per range not as expected:"; cat "$d/out.json"; fail=1; }
  grep -qE '^  batch host: [0-9.]+ of the ring.s rate \[turns [0-9.]+ [0-9.]+\], p99.9' "$d/out" ||
    { echo "--turns 2: no ratio line with each turn's:"; cat "$d/out"; fail=1; }
  # A peer row: the program is run as PROGRAM FILE IO DEPTH SECONDS in each turn and its summary and latencies
  # read back; one that prints anything else gives a row marked ERRORS, never a figure.
  printf '#!/bin/sh\nprintf '"'"'{"what": "fake", "io": %%s, "nbytes": %%s, "ops": 2, "seconds": 0.5, "cpu_seconds": 0.1}\\n0.001\\n0.002\\n'"'"' "$2" $(($2 * 2))\n' > "$d/peer"
  printf '#!/bin/sh\necho '"'"'{"what": "fake", "nbytes": 8192, "ops": 2, "seconds": 0.5, "cpu_seconds": 0.1}'"'"'\necho 0.001\necho "\033[2J"\n' > "$d/badpeer"
  chmod +x "$d/peer" "$d/badpeer"
  "$bin" "$d/data" 8M 0.2 64K:4 --turns 2 --rows batch-host --peer "$d/peer" --json "$d/peer.json" > "$d/out" 2>&1
  grep -qE '^  fake gpu +[0-9.]+ GiB/s +4 IOPS' "$d/out" || { echo "--peer: no row of the peer's figures:"; cat "$d/out"; fail=1; }
  grep -qE '"what": "fake gpu", "gib_s": [0-9.]+, "iops": 4, .*"ok": true, "turns": 2' "$d/peer.json" ||
    { echo "--peer: no JSON row of the peer's:"; cat "$d/peer.json"; fail=1; }
  "$bin" "$d/data" 8M 0.2 64K:4 --rows batch-host --peer "$d/badpeer" > "$d/out" 2>&1
  grep -qE '^  peer gpu .*ERRORS' "$d/out" && grep -qF "a latency line is not a number" "$d/out" ||
    { echo "--peer: a peer printing garbage was not refused:"; cat "$d/out"; fail=1; }
  if grep -q $'\033' "$d/out"; then echo "--peer: the peer's raw output reached the terminal"; fail=1; fi
  # A name that would break the JSON rows (a quote), and a summary line nested past any real one's length.
  printf '#!/bin/sh\necho '"'"'{"what": "a\\"b", "nbytes": 65536, "ops": 1, "seconds": 0.5, "cpu_seconds": 0.1}'"'"'\necho 0.001\n' > "$d/quotepeer"
  printf '#!/bin/sh\nhead -c 100000 /dev/zero | tr "\\0" "["\necho\n' > "$d/deeppeer"
  chmod +x "$d/quotepeer" "$d/deeppeer"
  for p in quotepeer deeppeer; do
    "$bin" "$d/data" 8M 0.2 64K:4 --rows batch-host --peer "$d/$p" --json "$d/$p.json" > "$d/out" 2>&1
    grep -qE '^  peer gpu .*ERRORS' "$d/out" && grep -qF "its first line is not the expected summary" "$d/out" ||
      { echo "--peer: $p was not refused:"; cat "$d/out"; fail=1; }
    python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$d/$p.json" 2> /dev/null ||
      { echo "--peer: $p left a --json file that is not JSON"; fail=1; }
  done
  # A peer that never ends, one that closes its output and goes on, a script whose child never ends, and one
  # that prints without end: each is stopped at --peer-timeout or at its output limit (with everything it
  # started), its row refused, and batch_bench goes on.
  printf '#!/bin/sh\nexec sleep 300\n' > "$d/hangpeer"
  printf '#!/bin/sh\nexec > /dev/null\nexec sleep 300\n' > "$d/mutepeer"
  printf '#!/bin/sh\nsleep 297\n' > "$d/wrappeer"
  printf '#!/bin/sh\nexec cat /dev/zero\n' > "$d/floodpeer"
  chmod +x "$d/hangpeer" "$d/mutepeer" "$d/wrappeer" "$d/floodpeer"
  for p in hangpeer:2:"did not finish within --peer-timeout (2 s)" mutepeer:2:"did not finish within --peer-timeout" \
           wrappeer:2:"did not finish within --peer-timeout" floodpeer:40:"printed more than 256"; do
    name=${p%%:*} rest=${p#*:}
    start=$(date +%s)
    timeout 80 "$bin" "$d/data" 8M 0.2 64K:4 --rows batch-host --peer "$d/$name" --peer-timeout "${rest%%:*}" > "$d/out" 2>&1
    rc=$?
    took=$(( $(date +%s) - start ))
    { [ "$rc" -eq 0 ] && grep -qE '^  peer gpu .*ERRORS' "$d/out" && grep -qF "${rest#*:}" "$d/out" && [ "$took" -lt 60 ]; } ||
      { echo "--peer: $name was not stopped (exit $rc, $took s):"; cat "$d/out"; fail=1; }
  done
  if pgrep -f "sleep 297" > /dev/null; then echo "--peer: a stopped peer's child still runs"; fail=1; fi
else
  echo "skipped the pass of two turns: ${TMPDIR:-/tmp} has no O_DIRECT"
fi
exit $fail
