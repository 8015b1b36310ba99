#!/usr/bin/env bash
# gdskit bench against hostile sizes and resource limits: every case ends in a clear exit code and a reason,
# never a crash, a signal or a half-written file.
# Usage: bench_limits.sh <gdskit binary> <source dir> <build dir>
set -u
source "$(dirname "$0")/lib.bash" "$@"

head -c 65536 /dev/zero >"$work/data"

# Sizes, offsets and their sums past 2^63 - 1: refused before anything runs.
expect 2 bench -f "$work/new" -s 9223372036854775808 -w 2 -I 1
expect 2 bench -f "$work/new" -s 4611686018427387904 -w 2 -I 1
expect 2 bench -f "$work/data" -o 18446744073709551615 -s 4096 -i 4096
expect 2 bench -f "$work/new" -o 9223372036854771712 -s 8192 -i 4096 -I 1
[ ! -e "$work/new" ] || fail "a refused run created its file"

# -T that is not a duration.
for t in nan inf -inf -1 1e9; do expect 2 bench -f "$work/data" -s 4K -i 4K -T "$t"; done

# A NUL in a job file would cut the file name short: the job file is refused, naming the line.
printf '[global]\nsize=4K\nbs=4K\n[job1]\nrw=write\nfilename=%s\0.junk\n' "$work/nul" >"$work/nul.gdsio"
err=$("$gdskit" bench "$work/nul.gdsio" 2>&1 >/dev/null); rc=$?
[ $rc -eq 2 ] || fail "job file with a NUL exited $rc, want 2: $err"
grep -q 'line 6' <<<"$err" || fail "the NUL's line is not named: $err"
[ ! -e "$work/nul" ] || fail "the job file with a NUL created a file"
# Control characters from a job file are not echoed raw.
printf '[job1]\nbogus\033[2J=1\n' >"$work/esc.gdsio"
err=$("$gdskit" bench "$work/esc.gdsio" 2>&1 >/dev/null)
if printf '%s' "$err" | grep -q $'\033'; then fail "an escape sequence from the job file reached the terminal"; fi

# A write past `ulimit -f` fails with EFBIG (exit 3), not SIGXFSZ.
err=$(ulimit -f 64; "$gdskit" bench -f "$work/big" -s 1M -i 64K -I 1 --quiet 2>&1 >/dev/null); rc=$?
[ $rc -eq 3 ] || fail "write past ulimit -f exited $rc, want 3: $err"
grep -qi 'too large' <<<"$err" || fail "EFBIG not reported: $err"

# More workers than the process may start (RLIMIT_NPROC): an error with exit 3, never terminate().
# The limit counts every process of the user and does not bind root, so root runs the case as nobody.
if command -v prlimit >/dev/null; then
  as_user=()
  if [ "$(id -u)" -eq 0 ]; then
    if command -v setpriv >/dev/null && setpriv --reuid=65534 --regid=65534 --clear-groups true 2>/dev/null; then
      as_user=(setpriv --reuid=65534 --regid=65534 --clear-groups)
      chmod 777 "$work"
    else
      as_user=(skip)
    fi
  fi
  if [ "${as_user[0]:-}" != skip ]; then
    user=$(id -un)
    [ ${#as_user[@]} -gt 0 ] && user=nobody
    have=$(ps -L -u "$user" --no-headers 2>/dev/null | wc -l)
    limit=$((have + 40))
    err=$("${as_user[@]}" prlimit --nproc=$limit "$gdskit" bench -f "$work/threads" -s 64K -i 4K -w 200 -I 1 --quiet 2>&1 >/dev/null)
    rc=$?
    [ $rc -eq 3 ] || fail "-w 200 under prlimit --nproc=$limit exited $rc, want 3: $err"
    grep -q 'worker thread' <<<"$err" || fail "no reason for the thread failure: $err"
    [ ! -e "$work/threads" ] || fail "the failed run left its file behind"
  else
    echo "note: RLIMIT_NPROC case skipped (root without setpriv)"
  fi
fi

echo "ok"
