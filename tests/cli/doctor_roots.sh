#!/usr/bin/env bash
# gdskit doctor --root on hostile roots and capture archives: a size field an owner name would hide, archive
# names with colons, cufile.json nested without end, links that lead out of the root, escape sequences in
# captured files. Each must be refused (exit 2) or reported (exit 1) without a crash, without reading or
# copying a file outside the root, without terminal control bytes and without leaving files in $TMPDIR.
# Usage: doctor_roots.sh <gdskit binary> <source dir> <build dir>
set -u
source "$(dirname "$0")/lib.bash" "$@"
src=$2
base=$src/tests/fixtures/systems/gds-ok-nvme-ext4
mkdir -p "$work/tmp"
export TMPDIR=$work/tmp

fresh() {  # fresh <name>: a copy of the good fixture
  rm -rf "${work:?}/$1"
  cp -r "$base" "$work/$1"
  echo "$work/$1"
}

run_doctor() {  # run_doctor <root> [args...]: sets rc, out, err
  local root=$1
  shift
  out=$( (limit_memory 2097152; timeout 60 "$gdskit" doctor --root "$root" --no-color "$@") 2>"$work/err")
  rc=$?
  err=$(cat "$work/err")
}

tmp_is_empty() { [ -z "$(ls -A "$work/tmp")" ] || fail "$1: left in \$TMPDIR: $(ls -A "$work/tmp")"; }

# A member whose declared size is far beyond the cap, under an owner name with a space in it ("x 0"): refused
# from its header, before a byte is written.
python3 - "$work/owner.tar.gz" <<'EOF'
import io, sys, tarfile
class Zeros(io.RawIOBase):
    def __init__(self, n): self.n = n
    def readable(self): return True
    def readinto(self, b):
        k = min(len(b), self.n); b[:k] = bytes(k); self.n -= k; return k
with tarfile.open(sys.argv[1], "w:gz", compresslevel=1) as t:
    info = tarfile.TarInfo("proc/modules"); info.size = 600 << 20; info.uname = "x 0"; info.gname = "grp"
    t.addfile(info, io.BufferedReader(Zeros(info.size)))
EOF
run_doctor "$work/owner.tar.gz"
[ "$rc" -eq 2 ] || fail "600 MiB member behind an owner name with a space: exit $rc (want 2): $err"
grep -q '512 MiB' <<<"$err" || fail "the refusal does not name the size limit: $err"
tmp_is_empty "owner name with a space"

# A capture named with a timestamp (colons) is a local file, not a remote host.
"$gdskit" doctor --root "$base" --no-color --capture "$work/good.tar.gz" >/dev/null 2>&1
colon=$work/capture-2026-11-29T10:00:00.tar.gz
cp "$work/good.tar.gz" "$colon"
run_doctor "$colon"
[ "$rc" -eq 0 ] || fail "capture named with colons: exit $rc: $err"
grep -q "^root $colon " <<<"$out" || fail "capture named with colons: report does not name it: $out"
tmp_is_empty "capture named with colons"

# cufile.json nested 200000 levels deep: a report, no crash, and nothing left behind when it came in an archive.
r=$(fresh deep-json)
python3 -c 'import sys; n=200000; sys.stdout.write("{\"denylist\": {\"drivers\": " + "["*n + "]"*n + "}}")' >"$r/etc/cufile.json"
run_doctor "$r"
[ "$rc" -eq 0 ] || [ "$rc" -eq 1 ] || fail "deeply nested cufile.json: exit $rc: $err"
grep -q 'userspace.cufile_json.*nested deeper than 64 levels' <<<"$out" || fail "deep cufile.json not named: $out"
tar -czf "$work/deep.tar.gz" -C "$r" .
run_doctor "$work/deep.tar.gz"
[ "$rc" -eq 0 ] || [ "$rc" -eq 1 ] || fail "deeply nested cufile.json in an archive: exit $rc: $err"
tmp_is_empty "deeply nested cufile.json in an archive"

# Links that leave the root, absolute or climbing with "..", at the last component or in the middle: never
# followed, never copied into a capture.
echo "SECRET-KERNEL-RELEASE" >"$work/secret"
mkdir -p "$work/outside/kernel"
echo "SECRET-THROUGH-A-FOLDER" >"$work/outside/kernel/osrelease"
for kind in absolute relative folder; do
  r=$(fresh "link-$kind")
  rm "$r/proc/sys/kernel/osrelease"
  case $kind in
    absolute) ln -s "$work/secret" "$r/proc/sys/kernel/osrelease" ;;
    relative) ln -s ../../../../secret "$r/proc/sys/kernel/osrelease" ;;
    folder) rm -r "$r/proc/sys"; ln -s ../../outside "$r/proc/sys" ;;
  esac
  run_doctor "$r" --capture "$work/link-$kind.tar.gz"
  [ "$rc" -le 1 ] || fail "link ($kind) out of the root: exit $rc: $err"
  grep -q SECRET <<<"$out" && fail "link ($kind) out of the root was followed: $out"
  grep -q 'kernel.release .*not readable' <<<"$out" || fail "link ($kind): kernel release should be unknown: $out"
  mkdir -p "$work/x-$kind"
  tar -xzf "$work/link-$kind.tar.gz" -C "$work/x-$kind"
  grep -rq SECRET "$work/x-$kind" && fail "link ($kind) out of the root was copied into the capture"
done
# A relative link that stays inside the root is followed, as it would be on the captured machine.
r=$(fresh link-inside)
mv "$r/proc/sys/kernel/osrelease" "$r/proc/osrelease-real"
ln -s ../../osrelease-real "$r/proc/sys/kernel/osrelease"
run_doctor "$r"
grep -q 'kernel.release .*6.8.0-1021-nvidia' <<<"$out" || fail "a link inside the root was not followed: $out"

# Escape sequences and bell characters in captured files reach the report only as visible escapes.
r=$(fresh escapes)
printf 'Model: \t NVIDIA \033]0;owned\007\033[2J GeForce\nIRQ: 1\n' >"$r/proc/driver/nvidia/gpus/0000:01:00.0/information"
printf '6.8.0\033[31m-evil\n' >"$r/proc/sys/kernel/osrelease"
run_doctor "$r"
[ "$rc" -le 1 ] || fail "escapes in captured files: exit $rc: $err"
LC_ALL=C grep -q $'[\x01-\x08\x0b-\x1f\x7f]' <<<"$out" && fail "control bytes reached the report: $(printf '%q' "$out")"
grep -q 'x1b' <<<"$out" || fail "escapes not shown as text: $out"

# --capture onto a FIFO or a folder is refused at once (a FIFO without a reader used to block the doctor), and a
# missing folder is named once.
mkfifo "$work/fifo"
err=$(timeout 20 "$gdskit" doctor --root "$base" --no-color --capture "$work/fifo" 2>&1 >/dev/null)
rc=$?
[ "$rc" -eq 2 ] || fail "--capture onto a FIFO: exit $rc: $err"
grep -q 'not a regular file' <<<"$err" || fail "--capture onto a FIFO: $err"
err=$("$gdskit" doctor --root "$base" --no-color --capture "$work/none/x.tar.gz" 2>&1 >/dev/null)
[ $? -eq 2 ] || fail "--capture into a missing folder must exit 2"
[ "$err" = "gdskit doctor: --capture $work/none/x.tar.gz: cannot create it: the folder $work/none does not exist" ] ||
  fail "--capture into a missing folder: $err"

echo "ok"
