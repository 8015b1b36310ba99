#!/usr/bin/env bash
# On a GPU machine: the transfer core's tests and benchmarks in one go, from binaries scripts/gpu-pack.sh built
# (.carry/bin, .carry/lib) and the RAM-backed loop device script copied to .carry/tools/fastdisk.sh.
#   scripts/gpu-batch-run.sh OUT_DIR [SECONDS_PER_RUN]
# WHAT: "all" (default), or a list of sections: "tests bench cli gather seq save". Logs are also packed into
# OUT_DIR.logs.tgz.
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

# The Python extension, compiled here against this machine's Python and a carried library:
#   build_ext NAME SOURCE_TREE LIB_DIR OUT_DIR
build_ext() { step "$1" 300 bash scripts/gpu-python-ext.sh "$2" "$3" "$4"; }
py=/tmp/gdskit-py
build_ext python_build . "$carry/lib" "$py"

want() { [ "${WHAT:-all}" = all ] || [[ " ${WHAT} " == *" $1 "* ]]; }
if want tests; then
  step unit_batch 300 env TMPDIR="$fast" bash -c "$bin/batch_test --gtest_brief=1 && $bin/batch_driver_test --gtest_brief=1"
  step gpu_paths 300 env TMPDIR="$fast" "$bin/gpu_paths_test" --gtest_brief=1
  step python_batch 300 env PYTHONPATH="$py" TMPDIR="$fast" python3 -m pytest -q -p no:cacheprovider python/tests/test_batch.py python/tests/test_kv.py python/tests/test_kv_adapters_vllm.py python/tests/test_kv_adapters_sglang.py
fi
if want bench; then
  TAIL=40 step batch_bench_fast 900 "$bin/batch_bench" "$fast/bb.dat" 8G "$secs" "4K:64,64K:64,2M:16" --json "$out/batch_fast.json"
  TAIL=40 step batch_bench_virtio 900 "$bin/batch_bench" "$slow/bb.dat" 4G "$secs" "4K:64,64K:64,2M:16" --json "$out/batch_virtio.json"
  rm -f "$slow/bb.dat" "$fast/bb.dat"
fi
if want cli; then
  # gdskit bench: the batch types against one worker per request, 4 KiB random reads at depth 64, cold.
  g="$bin/gdskit"
  f="$fast/cli.dat"
  "$g" bench -f "$f" -s 4G -i 1M -w 8 -I 1 -x host --quiet > "$out/cli_prep.log" 2>&1
  for x in "-x 6 -B 64 -w 1 -s 4G" "-x 7 -B 64 -w 1 -s 4G" "-x host-batch -B 64 -w 1 -s 4G" \
           "-x staged -w 64 -s 64M" "-x host -w 64 -s 64M"; do
    name=cli_$(echo "$x" | tr -c 'a-z0-9' '_')
    TAIL=3 step "$name" 120 "$g" bench -f "$f" -i 4K -I 2 -T "$secs" --cold $x -k 5 --json --quiet
    python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['results'][0]; print('   ', sys.argv[2], 'GiB/s %.3f' % r['throughput_gib_s'], 'p999 %.0f us' % r['latency_us']['p999'], 'CPU-s/GiB %.3f' % r['cpu']['s_per_gib'], 'path', r['path']['ran'])" "$out/$name.log" "$x" >> "$summary" 2>&1
  done
  TAIL=8 step cli_x6_verify 120 "$g" bench -f "$f" -s 256M -i 4K:1M:4K -I 3 -x 6 -B 100 -V -k 11 --quiet
  TAIL=8 step cli_x6_verify_read 120 "$g" bench -f "$f" -s 256M -i 4K:1M:4K -I 2 -x 6 -B 100 -V -k 11 --quiet
  TAIL=8 step cli_x7_verify_read 120 "$g" bench -f "$f" -s 256M -i 4K:1M:4K -I 2 -x 7 -B 100 -V -k 11 --quiet
  rm -f "$f"
fi
if want gather; then
  TAIL=20 step gather_fast 900 env PYTHONPATH="$py" PYTHONUNBUFFERED=1 python3 scripts/gather-bench.py \
      --file "$fast/emb.npy" --size-gib 8 --row-bytes 4096 --rows 100000 --rounds 3 --ring "$bin/batch_bench" \
      --json "$out/gather_fast.json"
  rm -f "$fast"/emb.npy*
fi
if want seq; then
  # Sequential loads and saves before the batch core (.carry/before: library and sources of that commit) and
  # now, alternating in one run, with fastsafetensors (.carry/peers) as the peer on the same checkpoint.
  pyb=/tmp/gdskit-py-before
  build_ext python_build_before "$carry/before" "$carry/before/lib" "$pyb"
  step fst_build 200 bash "$carry/peers/fastsafetensors/build.sh" /tmp/fst
  mkdir -p /tmp/cudart && ln -sf /usr/local/cuda/lib64/libcudart.so.13 /tmp/cudart/libcudart.so
  ck="$fast/ck"
  mkdir -p "$ck"
  step make_checkpoint 300 python3 - "$ck" "${ST_SIZE_GIB:-4}" <<'PY'
import sys, torch
from safetensors.torch import save_file
d, gib = sys.argv[1], float(sys.argv[2])
n = int(gib * 2**30 / (2 * 4096 * 11008))
per = max(n // 4, 1)
for s in range(4):
    t = {f"l{s}.{i}.w": torch.randn(4096, 11008, dtype=torch.bfloat16) for i in range(per)}
    t[f"l{s}.norm"] = torch.randn(4097, dtype=torch.float32)
    save_file(t, f"{d}/model-{s:05d}-of-00004.safetensors")
print("made", per * 4, "matrices")
PY
  for round in 1 2; do
    for v in after before; do
      p=$py; [ $v = before ] && p=$pyb
      TAIL=6 step "load_${v}_$round" 300 env PYTHONPATH="$p" python3 scripts/load-bench.py "$ck" --cold --warm --runs 3
    done
  done
  TAIL=12 step fst_load 400 env PYTHONPATH=/tmp/fst LD_LIBRARY_PATH=/tmp/cudart python3 \
      "$carry/peers/fastsafetensors/bench_fst.py" "$ck"/*.safetensors --runs 3 --cold
  rm -rf "$ck"
  for v in after before; do
    p=$py; [ $v = before ] && p=$pyb
    TAIL=16 step "save_$v" 400 env PYTHONPATH="$p" python3 scripts/perf-save.py --dir "$fast" --size-gib "${ST_SIZE_GIB:-4}" \
        --runs 2 --skip torch.save
  done
fi
if want save; then
  # Saves from GPU memory through the current build only (no "before" build needed): gdskit against safetensors
  # and the raw O_DIRECT writer in the same run, on a device written through first (a RAM-backed loop device
  # allocates its backing pages on a block's first write).
  TAIL=16 step save_now 500 env PYTHONPATH="$py" python3 scripts/perf-save.py --dir "$fast" \
      --size-gib "${ST_SIZE_GIB:-4}" --runs "${SAVE_RUNS:-3}" --precondition-gib "${SAVE_PRECONDITION_GIB:-8}" --skip torch.save
fi
bash "$carry/tools/fastdisk.sh" down /mnt/gdskit-fast
echo "== done" >> "$summary"
tar -C "$out" -czf "$out.logs.tgz" . 2>/dev/null
cat "$summary"
