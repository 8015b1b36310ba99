#!/usr/bin/env bash
# gdskit bench's flags on the CLI's parser: gdsio's extra flags accepted where they mean something, refused with the
# reason otherwise; unknown flags answered with the closest match; the gdsio result line unchanged.
# Usage: bench_flags.sh <gdskit binary> <source dir> <build dir>
set -u
source "$(dirname "$0")/lib.bash" "$@"

head -c 65536 /dev/zero >"$work/data"
run=(-f "$work/data" -s 16K -i 4K --quiet)

# Accepted: the run happens and prints gdsio's line.
for extra in "-b" "-R" "-J" "-m 0" "-F -I 1" "-O 1"; do
  out=$("$gdskit" bench "${run[@]}" $extra 2>&1) || fail "bench $extra exited $?: $out"
  grep -q '^IoType: \(READ\|WRITE\) XferType: CPUONLY Threads: 1 DataSetSize: 16/16(KiB) IOSize: 4(KiB) Throughput: ' \
    <<<"$out" || fail "bench $extra: no gdsio line: $out"
done
if [ -n "$(cat /sys/devices/system/node/node0/cpulist 2>/dev/null)" ]; then
  out=$("$gdskit" bench "${run[@]}" -n 0 -v 2>&1) || fail "bench -n 0 exited $?: $out"
  grep -q 'NUMA node 0' <<<"$out" || fail "bench -n 0 does not say where the workers ran: $out"
fi

# Refused with a reason (exit 2).
refused() {
  local why=$1; shift
  local err rc
  err=$("$gdskit" bench "${run[@]}" "$@" 2>&1 >/dev/null); rc=$?
  [ $rc -eq 2 ] || fail "bench $* exited $rc, want 2: $err"
  grep -qi "$why" <<<"$err" || fail "bench $*: reason without '$why': $err"
}
refused NVLink -p
refused "only the batch types" -B 8
refused "read job and a write job" -M 50
refused "4 KiB aligned" -U
refused "4 KiB aligned" -a 4K
refused RDMA -P rdma://host
refused cuMemAlloc -m 1
refused "pread/pwrite" -m 3
refused "NUMA node 1000" -n 1000
refused "needs a value\|required" -w
refused "did you mean '--json'" --jsn
refused "did you mean '--sweep'" --swep threads=1
# A size of zero is refused naming the flag as given (never the job's internal name), before any file is made;
# from a job file, naming its line.
err=$("$gdskit" bench -f "$work/new" -s 0 -I 1 2>&1 >/dev/null); rc=$?
[ $rc -eq 2 ] && grep -q '^gdskit bench: -s 0: the size per worker must be at least 1 byte$' <<<"$err" ||
  fail "-s 0: exit $rc: $err"
printf '[job1]\nfilename=%s\nrw=write\nsize=0K\n' "$work/new" >"$work/zero.gdsio"
err=$("$gdskit" bench "$work/zero.gdsio" 2>&1 >/dev/null); rc=$?
[ $rc -eq 2 ] && grep -q 'line 4: size= 0K: the size per worker must be at least 1 byte$' <<<"$err" ||
  fail "size=0K in a job file: exit $rc: $err"
[ ! -e "$work/new" ] || fail "a refused size of zero created the file"
# The same refusals from a job file, named by line.
printf '[job1]\nfilename=%s\nsize=16K\nbs=4K\nenable_nvlinks=1\n' "$work/data" >"$work/nvlink.gdsio"
err=$("$gdskit" bench "$work/nvlink.gdsio" 2>&1 >/dev/null); rc=$?
[ $rc -eq 2 ] && grep -q 'line 5: enable_nvlinks=.*NVLink' <<<"$err" || fail "job-file enable_nvlinks=1: $rc $err"

# A job file that is a FIFO or a device is refused at once (never waited on, never read without end), and one
# past 1 MiB is refused as not a job file.
mkfifo "$work/jobs.fifo"
for jobs in "$work/jobs.fifo" /dev/zero; do
  err=$(timeout 20 "$gdskit" bench "$jobs" 2>&1 >/dev/null); rc=$?
  [ $rc -eq 2 ] && grep -q 'not a regular file' <<<"$err" || fail "job file $jobs: exit $rc: $err"
done
head -c 1100000 /dev/zero | tr '\0' '#' >"$work/big.gdsio"
err=$("$gdskit" bench "$work/big.gdsio" 2>&1 >/dev/null); rc=$?
[ $rc -eq 2 ] && grep -q 'larger than 1 MiB' <<<"$err" || fail "a 1.1 MB job file: exit $rc: $err"
echo "ok"
