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
# Sizes that do not fit together are named by the flags the user gave (the command line's job has no name), with
# the default -i said to be one; from a job file, by the job.
flags_refused() {
  local want=$1; shift
  local err rc
  err=$("$gdskit" bench "$@" 2>&1 >/dev/null); rc=$?
  [ $rc -eq 2 ] && grep -qxF -- "gdskit bench: $want" <<<"$err" || fail "bench $*: exit $rc: $err"
}
flags_refused "-s 4.00 KiB: smaller than one request of the default io size 1.00 MiB; raise -s or give a smaller -i" \
  -f "$work/data" -s 4K
flags_refused "-i 8.00 KiB: larger than -s 4.00 KiB, the size per worker; lower -i or raise -s" \
  -f "$work/data" -s 4K -i 8K
flags_refused "-i up to 8.00 KiB: larger than -s 4.00 KiB, the size per worker; lower -i or raise -s" \
  -f "$work/data" -s 4K -i 4K:8K:4K
flags_refused "--sweep io 8.00 KiB: larger than -s 4.00 KiB, the size per worker; lower --sweep io or raise -s" \
  -f "$work/data" -s 4K -i 4K --sweep threads=1,io=8K
flags_refused "-s 4611686018427387904 x -w 2 from -o 0 passes the largest file offset (2^63 - 1 bytes); lower -s, -w or -o" \
  -f "$work/data" -s 4611686018427387904 -w 2
flags_refused "-s 4611686018427387904 x --sweep threads 2 from -o 0 passes the largest file offset (2^63 - 1 bytes); lower -s, --sweep threads or -o" \
  -f "$work/data" -s 4611686018427387904 -I 1 --sweep threads=1,2
flags_refused "-B 64 (the default) x io size 1.00 GiB is 64.00 GiB of memory per worker (at most 16 GiB); lower -B or -i" \
  -f "$work/data" -s 1G -i 1G -x host-batch
flags_refused "-B 32 x io size 1.00 GiB is 32.00 GiB of memory per worker (at most 16 GiB); lower -B or -i" \
  -f "$work/data" -s 1G -i 1G -x host-batch -B 32
printf '[small]\nfilename=%s\nsize=4K\n' "$work/data" >"$work/small.gdsio"
err=$("$gdskit" bench "$work/small.gdsio" 2>&1 >/dev/null); rc=$?
[ $rc -eq 2 ] && grep -qx 'gdskit bench: job small: io size 1.00 MiB is larger than the size per worker 4.00 KiB' <<<"$err" ||
  fail "size=4K in a job file: exit $rc: $err"
# From a job file the hints name its keys, not flags it cannot hold.
job_refused() {  # job_refused WANT (a grep pattern) JOB-FILE-TEXT
  printf '%b' "$2" >"$work/refused.gdsio"
  local err rc
  err=$("$gdskit" bench "$work/refused.gdsio" 2>&1 >/dev/null); rc=$?
  [ $rc -eq 2 ] && grep -q -- "$1" <<<"$err" || fail "job file $(printf '%q' "$2"): exit $rc: $err"
}
job_refused 'job big: .*lower size=, num_threads= or start_offset=$' \
  "[big]\nfilename=$work/data\nsize=4611686018427387904\nnum_threads=2\n"
job_refused 'job wide: batch_size 64 (the default) x bs 1.00 GiB is 64.00 GiB of memory per worker (at most 16 GiB); lower batch_size= or bs=$' \
  "[wide]\nfilename=$work/data\nsize=1G\nbs=1G\nxfer_type=host-batch\n"
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
