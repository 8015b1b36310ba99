#!/usr/bin/env bash
# gdskit doctor --root on hostile captured roots: huge or out-of-range numbers, bad escapes, FIFOs, a
# kallsyms that never ends, bytes that are not UTF-8. Each must give a report (exit 1: not GDS) quickly and
# in bounded memory, never a crash, a hang or exit 2.
# Usage: doctor_hostile.sh <gdskit binary> <source dir> <build dir>
set -u
source "$(dirname "$0")/lib.bash" "$@"
src=$2
base=$src/tests/fixtures/systems/gds-ok-nvme-ext4

fresh() {  # fresh <name>: a copy of the good fixture
  rm -rf "${work:?}/$1"
  cp -r "$base" "$work/$1"
  echo "$work/$1"
}

# run_doctor <root> [args...]: 20 s and 1 GiB of address space at most; sets rc, out, err.
run_doctor() {
  local root=$1
  shift
  out=$( (limit_memory 1048576; timeout 20 "$gdskit" doctor --root "$root" --no-color "$@") 2>"$work/err")
  rc=$?
  err=$(cat "$work/err")
}

expect_report() {  # expect_report <what>
  [ "$rc" -eq 1 ] || fail "$1: exit $rc (want 1, a report): $err"
  grep -q '^root ' <<<"$out" || fail "$1: no report: $out"
}

# A 400,000-digit version, a version beyond int, an escape that is not octal.
r=$(fresh long-version)
{ printf 'NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  '; head -c 400000 /dev/zero | tr '\0' '1'; printf '.1  Release Build\n'; } \
  >"$r/proc/driver/nvidia/version"
run_doctor "$r"
expect_report "400k-digit version"
grep -q 'gpu.driver .*unrecognised' <<<"$out" || fail "long version not unknown: $out"

r=$(fresh big-version)
echo 'NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  99999999999.1  Release Build' >"$r/proc/driver/nvidia/version"
run_doctor "$r"
expect_report "version beyond int"
grep -q '\[unknown\] gpu.driver' <<<"$out" || fail "big version not unknown: $out"

r=$(fresh bad-escape)
printf '22 1 259:2 / /\\9zz rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw\n22 1 259:2 / / rw - ext4 /dev/x\\9 rw\n' \
  >"$r/proc/self/mountinfo"
run_doctor "$r"
expect_report "mount point with \\9zz"

# FIFOs where files belong: no wait, the file is "not readable".
r=$(fresh fifo)
rm "$r/proc/driver/nvidia/version" "$r/proc/modules"
mkfifo "$r/proc/driver/nvidia/version" "$r/proc/modules"
run_doctor "$r"
expect_report "FIFO in the root"
grep -q 'not a regular file (FIFO)' <<<"$out" || fail "FIFO not named: $out"

# kallsyms that never ends: refused as a device, memory stays bounded.
r=$(fresh zero)
rm "$r/proc/kallsyms"
ln -s /dev/zero "$r/proc/kallsyms"
run_doctor "$r"
expect_report "kallsyms -> /dev/zero"

# A capped file is reported as such.
r=$(fresh capped)
head -c $((2 << 20)) /dev/zero | tr '\0' 'x' >"$r/proc/cmdline"
run_doctor "$r"
[ "$rc" -le 1 ] || fail "2 MiB cmdline: exit $rc: $err"
grep -q 'inputs.capped' <<<"$out" || fail "capped file not reported: $out"

# JSON stays JSON with a Latin-1 byte in a captured file and with a --path that is not UTF-8.
r=$(fresh latin1)
printf 'NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.133.07  Caf\xe9 Build\n' >"$r/proc/driver/nvidia/version"
run_doctor "$r" --json
[ "$rc" -le 1 ] || fail "latin-1 --json: exit $rc: $err"
python3 -c 'import json,sys; json.loads(sys.stdin.buffer.read())' <<<"$out" || fail "latin-1 --json is not JSON: $out"
mkdir -p "$work/caf"$'\xe9'
out=$(timeout 20 "$gdskit" doctor --no-probe --json --path "$work/caf"$'\xe9' 2>"$work/err")
rc=$?
[ "$rc" -le 1 ] || fail "non-UTF-8 --path --json: exit $rc: $(cat "$work/err")"
python3 -c 'import json,sys; json.loads(sys.stdin.buffer.read())' <<<"$out" || fail "non-UTF-8 --path --json is not JSON"

# Bad --path and --root: exit 2 with a reason, never a report on some other folder.
for args in "--path $work/nonexistent" "--path $base/README.md" "--root $work/nonexistent" "--root $base/README.md"; do
  out=$(timeout 20 "$gdskit" doctor --no-probe $args 2>"$work/err")
  rc=$?
  [ "$rc" -eq 2 ] && [ -z "$out" ] || fail "doctor $args: exit $rc, out $out"
  grep -q 'gdskit doctor: --' "$work/err" || fail "doctor $args: no reason"
done
out=$(timeout 20 "$gdskit" doctor --no-probe --root $'/tmp\nx' 2>&1)
[ $? -eq 2 ] || fail "control characters in --root"

# --root accepts the archive --capture writes, and leaves no unpacked folder behind.
mkdir -p "$work/tmp"
cap=$work/cap.tar.gz
TMPDIR=$work/tmp timeout 20 "$gdskit" doctor --root "$base" --no-color --capture "$cap" >"$work/a.txt" 2>/dev/null
[ $? -eq 0 ] && [ -s "$cap" ] || fail "capture of the good fixture"
TMPDIR=$work/tmp timeout 20 "$gdskit" doctor --root "$cap" --no-color >"$work/b.txt" 2>"$work/err"
[ $? -eq 0 ] || fail "doctor --root archive: $(cat "$work/err")"
[ "$(head -1 "$work/a.txt")" = "$(head -1 "$work/b.txt")" ] || fail "archive verdict differs: $(head -1 "$work/b.txt")"
grep -q "^root $cap " "$work/b.txt" || fail "report names the archive: $(sed -n 2p "$work/b.txt")"
[ -z "$(ls -A "$work/tmp")" ] || fail "unpacked folder left behind: $(ls "$work/tmp")"
echo junk >"$work/junk.tar.gz"
TMPDIR=$work/tmp timeout 20 "$gdskit" doctor --root "$work/junk.tar.gz" >/dev/null 2>&1
[ $? -eq 2 ] || fail "junk archive must exit 2"
[ -z "$(ls -A "$work/tmp")" ] || fail "unpacked folder left behind after an error"

echo "ok"
