#!/usr/bin/env bash
# Runs the GPU tests and benchmarks on a GPU machine in one go, from binaries built elsewhere:
#   scripts/gpu-run.sh BIN_DIR OUT_DIR [tests|bench|cli|tune|python|all]
# BIN_DIR holds gdskit, gpu_paths_test, file_handle_test, io_faults_test, staged_test, host_read_bench and
# gpu_compare_bench (scripts/gpu-pack.sh makes it). Every log goes to OUT_DIR; a summary prints last.
set -uo pipefail
bin=$(cd "$1" && pwd)
out=$2
what=${3:-all}
mkdir -p "$out"
work=${GDSKIT_WORK:-/var/tmp/gdskit-gpu}
mkdir -p "$work"
summary="$out/summary.txt"
: > "$summary"

step() {  # step NAME TIMEOUT_S COMMAND...
  local name=$1 limit=$2
  shift 2
  echo "== $name" | tee -a "$summary"
  local t0=$SECONDS
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "   rc=$rc ($((SECONDS - t0)) s)" | tee -a "$summary"
  tail -n "${TAIL:-25}" "$out/$name.log" >> "$summary"
}

{
  date -u
  uname -r
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nproc
  free -g | head -2
  df -h "$work" | tail -1
  ls -la /run/udev 2>&1 | head -3
} > "$out/machine.txt" 2>&1
cat "$out/machine.txt" >> "$summary"

if [ "$what" = tests ] || [ "$what" = all ]; then
  step abi_check 120 bash -c "g++ -std=c++20 -Isrc -I/usr/local/cuda/include tests/gpu/abi_check.cpp -o $work/abi_check && $work/abi_check"
  step version 30 "$bin/gdskit" version
  step unit_host 300 bash -c "cd $work && $bin/file_handle_test --gtest_brief=1 && $bin/io_faults_test --gtest_brief=1 && $bin/pipeline_test --gtest_brief=1 && $bin/batch_test --gtest_brief=1 && $bin/batch_driver_test --gtest_brief=1"
  step gpu_tests 400 env TMPDIR=$work "$bin/gpu_paths_test"
  step verify 300 "$bin/gdskit" verify -D "$work" --sizes 4K,1M+1,64M+4095,1G,4G -o 4097
  step doctor 120 "$bin/gdskit" doctor --path "$work"
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  TAIL=40 step host_read_bench 400 "$bin/host_read_bench" "$work/hb.dat" "${BENCH_SIZE:-8G}" 16 2
  rm -f "$work/hb.dat"
  TAIL=40 step gpu_compare_bench 500 "$bin/gpu_compare_bench" "$work/gb.dat" "${BENCH_SIZE:-8G}" 16
  rm -f "$work/gb.dat"
fi
if [ "$what" = cli ] || [ "$what" = all ]; then
  # gdskit bench's GPU transfer types, as a user runs them: 8 workers x 1 GiB, 8 MiB requests.
  g="$bin/gdskit"
  f="$work/bench.dat"
  common=(-f "$f" -w 8 -s 1G -i 8M -d 0 -k 7)
  TAIL=20 step bench_write_staged 200 "$g" bench "${common[@]}" -I 1 -x staged -V
  TAIL=20 step bench_read_staged_warm 200 "$g" bench "${common[@]}" -I 0 -x staged -V --warm
  TAIL=20 step bench_read_staged_cold 200 "$g" bench "${common[@]}" -I 0 -x staged -V --cold
  TAIL=20 step bench_read_naive_warm 200 "$g" bench "${common[@]}" -I 0 -x naive --warm
  TAIL=20 step bench_read_naive_cold 200 "$g" bench "${common[@]}" -I 0 -x naive --cold
  TAIL=20 step bench_read_host_warm 200 "$g" bench "${common[@]}" -I 0 -x host --warm
  TAIL=20 step bench_randread_staged 200 "$g" bench "${common[@]}" -s 256M -I 2 -i 64K -x staged -V --warm
  TAIL=20 step bench_gds_refused 60 "$g" bench "${common[@]}" -I 0 -x gds
  TAIL=20 step bench_compat_no_udev 120 "$g" bench "${common[@]}" -s 256M -I 0 -x compat
  # cuFile registers a file only with udev data for its block device; give it what udev would have written.
  majmin=$(findmnt -no MAJ:MIN -T "$work" | tr -d ' ')
  if [ ! -e "/run/udev/data/b$majmin" ]; then
    mkdir -p /run/udev/data
    printf 'E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=%s\n' "$(findmnt -no FSTYPE -T "$work")" > "/run/udev/data/b$majmin"
    echo "created /run/udev/data/b$majmin" >> "$summary"
  fi
  TAIL=20 step bench_compat_warm 200 "$g" bench "${common[@]}" -s 256M -I 0 -x compat -V --warm
  TAIL=20 step bench_compat_cold 200 "$g" bench "${common[@]}" -s 256M -I 0 -x compat --cold
  TAIL=20 step bench_compat_write 200 "$g" bench "${common[@]}" -s 256M -I 1 -x compat -V
  TAIL=20 step bench_compat_json 120 "$g" bench "${common[@]}" -s 256M -I 0 -x compat --json
  printf '[global]\nxfer_type=3\nrw=read\nbs=8M\nsize=512M\ndo_verify=1\nrandom_seed=7\ngpu_dev_id=0\n[a]\nfilename=%s\nnum_threads=4\n[b]\nfilename=%s\nnum_threads=4\nstart_offset=4G\n' "$f" "$f" > "$work/jobs.gdsio"
  TAIL=30 step bench_jobfile 200 "$g" bench "$work/jobs.gdsio" --warm
  TAIL=40 step bench_sweep_cold 400 "$g" bench -f "$f" -s 256M -i 1M --cold --sweep threads=1,2,4,8,16,x=staged,naive,compat --plot "$out/sweep_cold.png"
  TAIL=40 step bench_sweep_warm 400 "$g" bench -f "$f" -s 256M -i 1M --warm --sweep threads=1,2,4,8,16,x=staged,naive,compat,host --plot "$out/sweep_warm.png"
  rm -f "$f"
fi
if [ "$what" = tune ] || [ "$what" = all ]; then
  TAIL=60 step tune 500 "$bin/gpu_compare_bench" "$work/tune.dat" "${BENCH_SIZE:-8G}" 16 tune
  rm -f "$work/tune.dat"
fi
if [ "$what" = python ] || [ "$what" = all ]; then
  # The extension is compiled here against this machine's Python and pybind11, linking the carried library.
  carry=$(cd "$bin/.." && pwd)
  py="$work/py"
  step python_build 300 bash scripts/gpu-python-ext.sh . "$carry/lib" "$py"
  TAIL=40 step python_tests 400 env PYTHONPATH="$py" PYTHONUNBUFFERED=1 python3 scripts/gpu-safetensors-test.py --cli "$bin/gdskit" --dir "$work"
  TAIL=40 step python_perf 500 env PYTHONPATH="$py" PYTHONUNBUFFERED=1 python3 scripts/perf-safetensors.py --dir "$work" --size-gib "${ST_SIZE_GIB:-4}" --runs 2 --cli "$bin/gdskit"
fi
echo "== done" >> "$summary"
cat "$summary"
