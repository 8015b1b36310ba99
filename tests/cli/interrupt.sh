#!/usr/bin/env bash
# SIGINT and SIGTERM mid-run: bench and verify remove the files they created, leave the user's files alone, and
# exit 130 / 143.
# Usage: interrupt.sh <gdskit binary> <source dir> <build dir>
set -u
source "$(dirname "$0")/lib.bash" "$@"
command -v python3 >/dev/null || { echo "skipped: python3 is needed to signal a child process"; exit 77; }

# interrupt SIGNAL WANT_RC WATCH_GLOB ARGS...: starts gdskit ARGS, waits until a file matching WATCH_GLOB exists
# and the run is under way, sends SIGNAL, and checks the exit status.
interrupt() {
  python3 - "$gdskit" "$@" <<'PY' || fail "interrupt $*"
import glob, os, signal, subprocess, sys, time
gdskit, sig, want, watch, *args = sys.argv[1:]
p = subprocess.Popen([gdskit, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
deadline = time.time() + 60
while not glob.glob(watch):
    if p.poll() is not None or time.time() > deadline:
        sys.exit(f"the run ended ({p.returncode}) or never created {watch}: {p.stderr.read().decode()}")
    time.sleep(0.02)
# The signal is sent once the program catches it (its handler is installed: the bit in /proc's SigCgt), so
# a slow start (a loaded machine, a sanitizer build) cannot turn the test into one of the default action.
bit = 1 << (getattr(signal, sig) - 1)
while True:
    try:
        with open(f"/proc/{p.pid}/status") as f:
            caught = int(next(l for l in f if l.startswith("SigCgt:")).split()[1], 16)
    except (OSError, StopIteration):
        caught = 0
    if caught & bit:
        break
    if p.poll() is not None or time.time() > deadline:
        sys.exit(f"the run ended ({p.returncode}) or never caught {sig}: {p.stderr.read().decode()}")
    time.sleep(0.02)
time.sleep(0.5)  # well inside the run
if p.poll() is not None:
    sys.exit(f"the run ended before the signal: {p.returncode}")
p.send_signal(getattr(signal, sig))
rc = p.wait(timeout=60)
if rc != int(want):
    sys.exit(f"exit status {rc} after {sig}, want {want}: {p.stderr.read().decode()}")
PY
}

# bench: a timed write run into a file it created.
interrupt SIGINT 130 "$work/created" bench -f "$work/created" -s 16M -i 1M -I 1 -T 60 --quiet
[ ! -e "$work/created" ] || fail "bench left the file it created behind after SIGINT"
interrupt SIGTERM 143 "$work/created" bench -f "$work/created" -s 16M -i 1M -I 1 -T 60 --quiet
[ ! -e "$work/created" ] || fail "bench left the file it created behind after SIGTERM"
# A file that was there before the run is the user's: it stays.
head -c 1048576 /dev/zero >"$work/mine"
interrupt SIGINT 130 "$work/mine" bench -f "$work/mine" -s 1M -i 64K -I 1 -T 60 --quiet
[ -e "$work/mine" ] || fail "bench removed a file it did not create"

# verify: its test file, with the default name and with -f.
interrupt SIGINT 130 "$work/gdskit-verify.*" verify --host -D "$work" --sizes "$(printf '16M,%.0s' {1..200})16M"
[ -z "$(ls "$work" | grep gdskit-verify)" ] || fail "verify left its file behind after SIGINT: $(ls "$work")"
interrupt SIGTERM 143 "$work/v.dat" verify --host -f "$work/v.dat" --sizes "$(printf '16M,%.0s' {1..200})16M"
[ ! -e "$work/v.dat" ] || fail "verify left its file behind after SIGTERM"
# verify writing to a file: the lines of the sizes it finished are in the file after SIGTERM (each is flushed
# as it is printed; the signal ends the process at once).
python3 - "$gdskit" "$work" <<'PY' || fail "verify output after SIGTERM"
import os, signal, subprocess, sys, time
gdskit, work = sys.argv[1:]
out = os.path.join(work, "verify.out")
with open(out, "w") as f:
    p = subprocess.Popen([gdskit, "verify", "--host", "-f", os.path.join(work, "t.dat"), "--sizes",
                          "4K," + ",".join(["16M"] * 400)], stdout=f, stderr=subprocess.DEVNULL)
deadline = time.time() + 60
while "  ok  " not in open(out).read():
    if p.poll() is not None or time.time() > deadline:
        sys.exit(f"no result line reached the file before the run ended ({p.returncode}): {open(out).read()!r}")
    time.sleep(0.02)
p.send_signal(signal.SIGTERM)
rc = p.wait(timeout=60)
text = open(out).read()
if rc != 143:
    sys.exit(f"exit status {rc} after SIGTERM, want 143")
lines = text.splitlines()
# Whole lines only: a buffer written out when it filled would end inside a line.
if not lines or not lines[0].startswith("note: ") or not any("4.00 KiB  ok" in l for l in lines) or \
        not text.endswith("\n"):
    sys.exit(f"finished lines lost: {text!r}")
PY
[ ! -e "$work/t.dat" ] || fail "verify left its file behind after SIGTERM"

# bench --plot: the chart's data and script, in a private temporary folder, go while gnuplot still draws.
# gnuplot is the system's (PATH is not searched); the chart is a FIFO nobody reads yet, so it waits there.
if [ -x /usr/bin/gnuplot ] || [ -x /bin/gnuplot ] || [ -x /usr/sbin/gnuplot ] || [ -x /sbin/gnuplot ]; then
  mkdir -p "$work/tmp"
  mkfifo "$work/chart.png"
  head -c 65536 /dev/zero >"$work/plotdata"
  TMPDIR="$work/tmp" interrupt SIGINT 130 "$work/tmp/gdskit-plot-*/plot.gp" \
    bench -f "$work/plotdata" -s 64K -i 4K --sweep threads=1 --plot "$work/chart.png" --quiet
  timeout 10 cat "$work/chart.png" >/dev/null  # lets gnuplot finish
  [ -z "$(ls -A "$work/tmp")" ] || fail "bench --plot left its temporary files behind: $(ls -R "$work/tmp")"
else
  echo "bench --plot interruption not checked: no gnuplot in the system folders"
fi
echo "ok"
