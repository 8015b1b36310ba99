#!/usr/bin/env bash
# gdskit patch and setup at the command line: what users redirect into files (registry-dwords into
# modprobe.d, the setup plan into a script), hostile --src/--root values, FIFOs and endless files, JSON on
# bytes that are not UTF-8.
# Usage: patch_setup_cli.sh <gdskit binary> <source dir> <build dir>
set -u
source "$(dirname "$0")/lib.bash" "$@"
src=$2
fixtures=$src/tests/fixtures/patch

# run <args...>: 20 s and 1 GiB of address space at most; sets rc, out, err.
run() {
  out=$( (limit_memory 1048576; timeout 20 "$gdskit" "$@") 2>"$work/err")
  rc=$?
  err=$(cat "$work/err")
}

# stdout of registry-dwords must be a file modprobe accepts: comments, blank lines, one options line.
valid_conf() {
  local n
  n=$(grep -c '^options nvidia NVreg_RegistryDwords="[A-Za-z0-9=;x]*"$' <<<"$1")
  [ "$n" -eq 1 ] || return 1
  ! grep -vE '^(#.*|options nvidia NVreg_RegistryDwords="[A-Za-z0-9=;x]*"|)$' <<<"$1" >/dev/null
}

run patch registry-dwords --driver-version 580.95.05
[ "$rc" -eq 0 ] || fail "registry-dwords 580: exit $rc: $err"
valid_conf "$out" || fail "registry-dwords stdout is not a modprobe conf file: $out"
grep -q 'RMPcieP2PType=1' <<<"$out" || fail "580 value: $out"
grep -q 'note:' <<<"$err" || fail "notes belong on stderr: $err"

run patch registry-dwords --src "$fixtures/v570"
[ "$rc" -eq 0 ] || fail "registry-dwords --src v570: exit $rc: $err"
valid_conf "$out" || fail "v570 stdout: $out"
grep -q 'RMForceP2PType=2"' <<<"$out" || fail "570 value: $out"

cp -r "$fixtures/v550" "$work/v535"
sed -i 's/^NVIDIA_VERSION.*/NVIDIA_VERSION = 535.183.01/' "$work/v535/version.mk"
run patch registry-dwords --src "$work/v535"
[ "$rc" -eq 2 ] && [ -z "$out" ] || fail "535 tree must be refused with nothing on stdout: $rc $out"
grep -q '535.183.01' <<<"$err" || fail "refusal names the version: $err"
run patch registry-dwords --driver-version 535.183.01
[ "$rc" -eq 2 ] || fail "--driver-version 535 refused: $rc"
run patch registry-dwords --driver-version 535.183.01 --force
[ "$rc" -eq 0 ] && valid_conf "$out" || fail "--force prints a value: $rc $out"
run patch registry-dwords --src "$fixtures/no_version"
[ "$rc" -eq 2 ] && [ -z "$out" ] || fail "unknown version must be refused: $rc $out"

# --src values: missing, a file, control characters.
for bad in "$work/missing" "$work/v535/version.mk" $'/tmp\nx'; do
  for sub in check apply revert diff; do
    run patch "$sub" --src "$bad"
    [ "$rc" -eq 2 ] || fail "patch $sub --src '$bad': exit $rc"
  done
  run setup plan --src "$bad"
  [ "$rc" -eq 2 ] || fail "setup plan --src '$bad': exit $rc"
  run setup plan --root "$bad"
  [ "$rc" -eq 2 ] || fail "setup plan --root '$bad': exit $rc"
done

# The setup plan never runs what a path says.
run setup plan --src $'/x\ntouch '"$work"'/PWNED'
[ "$rc" -eq 2 ] && [ -z "$out" ] || fail "newline in --src must be refused: $rc $out"
odd="$work/it's \$(touch PWNED) \`x\`"
mkdir -p "$odd"
run setup plan --src "$odd" --registry-dwords
[ "$rc" -eq 0 ] || fail "plan for an odd path: $rc $err"
sh -n <<<"$out" || fail "plan is not valid shell"
sed -n '/=== Rollback plan/,$p' <<<"$out" | grep -v '^#' | grep . && fail "rollback section has a command line"
grep -qF "'$work/it'\\''s \$(touch PWNED) \`x\`'" <<<"$out" || fail "path not single-quoted: $out"
[ ! -e "$work/PWNED" ] || fail "PWNED created"

# FIFOs and endless files.
cp -r "$fixtures/v580" "$work/fifo"
rm "$work/fifo/version.mk"
mkfifo "$work/fifo/version.mk"
run patch check --src "$work/fifo"
[ "$rc" -eq 2 ] || fail "version.mk FIFO: exit $rc (124 is a hang): $err"
grep -q 'not a regular file (FIFO)' <<<"$err" || fail "FIFO not named: $err"
mkdir -p "$work/root/proc"
ln -s /dev/zero "$work/root/proc/kallsyms"
run setup plan --root "$work/root"
[ "$rc" -eq 0 ] || fail "setup plan with kallsyms -> /dev/zero: exit $rc: $err"

# JSON stays JSON when a path is not UTF-8.
latin=$'\xe9'
cp -r "$fixtures/v580" "$work/caf$latin"
for sub in check diff; do
  run patch "$sub" --src "$work/caf$latin" --json
  python3 -c 'import json,sys; json.loads(sys.stdin.buffer.read())' <<<"$out" || fail "patch $sub --json: $out"
done
# A rollback comment for a path with a quote runs as written once uncommented: it names the same folder.
quoted="$work/it's src"
mkdir -p "$quoted"
plan=$("$gdskit" setup plan --src "$quoted" 2>/dev/null)
line=$(grep -m1 '^#   gdskit patch revert --src ' <<<"$plan") || fail "no revert line in the rollback comments: $plan"
eval "set -- ${line#'#   gdskit patch revert --src '}"
[ "$1" = "$quoted" ] || fail "the uncommented rollback names '$1', not '$quoted'"
echo ok
