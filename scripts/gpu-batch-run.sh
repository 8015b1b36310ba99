#!/usr/bin/env bash
# On a GPU machine: the transfer core's tests and benchmarks in one go, from binaries scripts/gpu-pack.sh built
# (.carry/bin, .carry/lib) and the RAM-backed loop device script copied to .carry/tools/fastdisk.sh.
#   scripts/gpu-batch-run.sh OUT_DIR [SECONDS_PER_RUN]
# Logs go to OUT_DIR; a summary prints last. Measures on the loop device and on the machine's own disk.
set -uo pipefail
out=$1
secs=${2:-5}
bin=$(cd .carry/bin && pwd)
carry=$(cd .carry && pwd)
mkdir -p "$out"
summary="$out/summary.txt"
: > "$summary"
step() {  # step NAME TIMEOUT_S COMMAND...
  local name=$1 limit=$2
  shift 2
  echo "== $name" | tee -a "$summary"
  local t0=$SECONDS
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  echo "   rc=$? ($((SECONDS - t0)) s)" | tee -a "$summary"
  tail -n "${TAIL:-20}" "$out/$name.log" >> "$summary"
}
{ date -u; uname -r; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; free -g | head -2; } >> "$summary" 2>&1

fast=$(bash "$carry/tools/fastdisk.sh" up "${FAST_GIB:-24}" /mnt/gdskit-fast)
slow=/var/tmp/gdskit-gpu
mkdir -p "$slow"
echo "fast disk: $fast; virtual disk: $slow" >> "$summary"

# The Python extension, compiled here against this machine's Python and the carried library.
py=/tmp/gdskit-py
mkdir -p "$py"
cp -r python/gdskit "$py/"
step python_build 300 bash -c "g++ -O2 -std=c++20 -shared -fPIC -Iinclude -I$carry/include -Isrc \
    -I\$(python3 -c 'import sysconfig;print(sysconfig.get_paths()[\"include\"])') \
    -I\$(python3 -c 'import pybind11;print(pybind11.get_include())') -DGDSKIT_VERSION_TEXT='\"0.1.0\"' \
    python/src/*.cpp $carry/lib/libgdskit.a \$(ls $carry/lib/liburing.a 2>/dev/null) -ldl -lpthread \
    -o $py/gdskit/_gdskit\$(python3 -c 'import sysconfig;print(sysconfig.get_config_var(\"EXT_SUFFIX\"))')"

if [ "${WHAT:-all}" = all ] || [ "${WHAT:-}" = tests ]; then
  step unit_batch 300 env TMPDIR="$fast" bash -c "$bin/batch_test --gtest_brief=1 && $bin/batch_driver_test --gtest_brief=1"
  step gpu_paths 300 env TMPDIR="$fast" "$bin/gpu_paths_test" --gtest_brief=1
  step python_batch 300 env PYTHONPATH="$py" TMPDIR="$fast" python3 -m pytest -q -p no:cacheprovider python/tests/test_batch.py
fi
if [ "${WHAT:-all}" = all ] || [ "${WHAT:-}" = bench ]; then
  TAIL=40 step batch_bench_fast 900 "$bin/batch_bench" "$fast/bb.dat" 8G "$secs" "4K:64,64K:64,2M:16" --json "$out/batch_fast.json"
  TAIL=40 step batch_bench_virtio 900 "$bin/batch_bench" "$slow/bb.dat" 4G "$secs" "4K:64,64K:64,2M:16" --json "$out/batch_virtio.json"
  rm -f "$slow/bb.dat" "$fast/bb.dat"
  TAIL=20 step gather_fast 900 env PYTHONPATH="$py" PYTHONUNBUFFERED=1 python3 scripts/gather-bench.py \
      --file "$fast/emb.npy" --size-gib 8 --row-bytes 4096 --rows 100000 --rounds 3 --ring "$bin/batch_bench" \
      --json "$out/gather_fast.json"
fi
bash "$carry/tools/fastdisk.sh" down /mnt/gdskit-fast
echo "== done" >> "$summary"
cat "$summary"
