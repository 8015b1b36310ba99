#!/usr/bin/env bash
# A hostile PATH runs nothing: the programs gdskit starts (dmesg, nvidia-smi, modinfo, dkms, mokutil, tar, gzip,
# gnuplot, the shell of `setup plan --execute`) are found by absolute path in /usr/bin, /bin, /usr/sbin and
# /sbin, and get that PATH themselves (tar -z starts gzip). A folder of fakes put first on PATH must never run.
# Usage: hostile_path.sh <gdskit binary> <source dir> <build dir>
set -u
source "$(dirname "$0")/lib.bash" "$@"
src=$2

mkdir -p "$work/fakes" "$work/markers"
for p in dmesg nvidia-smi modinfo dkms mokutil lspci tar gzip gnuplot sh make grep cat true; do
  printf '#!/bin/sh\ntouch "%s/%s"\nexit 0\n' "$work/markers" "$p" >"$work/fakes/$p"
  chmod +x "$work/fakes/$p"
done
hostile="$work/fakes:$PATH"
no_markers() {  # no_markers <what>
  [ -z "$(ls -A "$work/markers")" ] || fail "$1 ran a program found through PATH: $(ls "$work/markers")"
}

# The live doctor runs dmesg, nvidia-smi, modinfo, dkms and mokutil where they exist.
out=$(PATH="$hostile" "$gdskit" doctor --no-probe --json 2>"$work/err")
rc=$?
[ "$rc" -le 1 ] || fail "doctor with a hostile PATH: exit $rc: $(cat "$work/err")"
no_markers "doctor"
# A program that is not in the system folders is named in the report, with where it was looked for.
for p in dmesg nvidia-smi; do
  if [ ! -x "/usr/bin/$p" ] && [ ! -x "/bin/$p" ] && [ ! -x "/usr/sbin/$p" ] && [ ! -x "/sbin/$p" ] &&
     [ ! -x "/usr/local/nvidia/bin/$p" ] && [ ! -x "/usr/lib/wsl/lib/$p" ]; then
    printf '%s' "$out" >"$work/report.json"
    python3 - "$p" "$work/report.json" <<'PY' || fail "doctor --json does not name the missing $p: $out"
import json, sys
missing = {m["name"]: m["searched"] for m in json.load(open(sys.argv[2]))["programs_not_found"]}
assert sys.argv[1] in missing and "/usr/bin" in missing[sys.argv[1]], missing
PY
    PATH="$hostile" "$gdskit" doctor --no-probe --no-color | grep -q "programs not found.*$p" ||
      fail "doctor does not say that $p was not found"
  fi
done
no_markers "doctor (text)"

# A capture is written by tar (which runs gzip) and read back through gzip.
if [ -x /usr/bin/tar ] || [ -x /bin/tar ]; then
  PATH="$hostile" "$gdskit" doctor --no-probe --capture "$work/c.tar.gz" >/dev/null 2>"$work/err"
  [ -s "$work/c.tar.gz" ] || fail "no capture written: $(cat "$work/err")"
  no_markers "doctor --capture"
  PATH="$hostile" "$gdskit" doctor --root "$work/c.tar.gz" --no-color >/dev/null 2>"$work/err"
  [ $? -le 1 ] || fail "the capture was not read back: $(cat "$work/err")"
  no_markers "doctor --root ARCHIVE"
fi

# A captured root: no program runs at all.
PATH="$hostile" "$gdskit" doctor --root "$src/tests/fixtures/systems/gds-ok-nvme-ext4" >/dev/null 2>&1
no_markers "doctor --root FOLDER"

# bench --plot draws with the system's gnuplot (or refuses before the run when there is none).
head -c 65536 /dev/zero >"$work/plotdata"
PATH="$hostile" "$gdskit" bench -f "$work/plotdata" -s 64K -i 4K --sweep threads=1 --plot "$work/chart.png" \
  --quiet >/dev/null 2>&1
no_markers "bench --plot"

# setup plan --execute: each step runs in /bin/sh with the system PATH (and this gdskit's folder).
# Two answers only, and no driver tree named: the first command steps are read-only checks, and a third answer
# could reach `gdskit patch apply` on a real tree of the machine running the tests.
yes y 2>/dev/null | head -n 2 | PATH="$hostile" env -u GDSKIT_DRIVER_SRC "$gdskit" setup plan --execute >/dev/null 2>&1
no_markers "setup plan --execute"
echo "ok"
