#!/usr/bin/env bash
# On a GPU machine: the KV-cache block store's tests with a GPU, `gdskit bench kv` on two disks and the end-to-end
# run with a real model runtime, in one go and within about 8 minutes, from the portable pack
# (scripts/gpu-pack.sh: .carry/bin/{gdskit,kv_store_test,kv_faults_test}, .carry/lib, .carry/include) and the
# RAM-backed loop device script copied to .carry/tools/fastdisk.sh.
#   scripts/gpu-kv-run.sh OUT_DIR
# Environment: FAST_GIB (RAM loop device size, default 16), KV_TOKENS (end-to-end prompt, default 16384),
# KV_BUDGET_S (whole run, default 470: a step that would start past it is skipped and says so), KV_GPU (the GPU
# whose memory the bench uses, default 0; empty: host memory), KV_CAPACITY_FAST / KV_CAPACITY_SLOW (the bench's
# store capacity on each disk, default 3G / 1G; the bench also writes as much again for its baseline).
# Disks: a RAM loop device (ext4) at /mnt/gdskit-fast, and /var/tmp (the machine's virtual disk). Logs go to
# OUT_DIR, one per step; a summary prints last (also OUT_DIR/summary.txt).
set -uo pipefail
out=${1:?usage: scripts/gpu-kv-run.sh OUT_DIR}
mkdir -p "$out" && out=$(cd "$out" && pwd) || exit 2
cd "$(dirname "$0")/.." || exit 2
carry=$(cd .carry 2>/dev/null && pwd) || { echo "gpu-kv-run: no .carry folder: make the pack with scripts/gpu-pack.sh" >&2; exit 2; }
bin=$carry/bin
budget=${KV_BUDGET_S:-470}
gpu=(--gpu "${KV_GPU-0}")
[ -z "${KV_GPU-0}" ] && gpu=()
summary="$out/summary.txt"
: > "$summary"
start=$SECONDS

note() { echo "$*" | tee -a "$summary"; }
step() {  # step NAME TIMEOUT_S COMMAND...  (skipped when it could not finish within the budget)
  local name=$1 limit=$2
  shift 2
  local left=$((budget - (SECONDS - start)))
  if [ "$left" -lt 20 ]; then
    note "== $name: SKIPPED (the run's budget of $budget s is spent)"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  note "== $name (limit $limit s)"
  local t0=$SECONDS
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  note "   rc=$rc ($((SECONDS - t0)) s)$([ $rc -eq 124 ] && echo ': TIMED OUT')"
  tail -n "${TAIL:-12}" "$out/$name.log" >> "$summary"
}

for f in "$bin/gdskit" "$bin/kv_store_test" "$bin/kv_faults_test" "$carry/lib/libgdskit.a" "$carry/tools/fastdisk.sh"; do
  if [ ! -e "$f" ]; then
    echo "gpu-kv-run: $f is missing: make the pack with scripts/gpu-pack.sh (and copy fastdisk.sh to .carry/tools)" >&2
    exit 2
  fi
done
{ date -u; uname -r; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc;
  free -g | head -2; } >> "$summary" 2>&1

fast=$(bash "$carry/tools/fastdisk.sh" up "${FAST_GIB:-16}" /mnt/gdskit-fast) || { note "fastdisk: failed"; exit 3; }
trap 'bash "$carry/tools/fastdisk.sh" down /mnt/gdskit-fast' EXIT
slow=/var/tmp/gdskit-kv
rm -rf "$slow"
mkdir -p "$slow"
note "fast disk: $fast (RAM loop device); virtual disk: $slow ($(df -h /var/tmp | tail -1 | awk '{print $1}'))"
# A fresh loop device's first writes also allocate its RAM: write it through once so that the raw rate and the
# store's puts both see a written device.
dd if=/dev/zero of="$fast/fill" bs=4M count=$(( (${FAST_GIB:-16} - 1) * 256 )) oflag=direct status=none 2>/dev/null
rm -f "$fast/fill"

# The Python extension, compiled here against this machine's Python and the carried library.
py=/tmp/gdskit-kv-py
step python_build 240 bash scripts/gpu-python-ext.sh . "$carry/lib" "$py"

# Tests with a GPU: the store's C++ tests (GPU memory, stream ordering, blocks over 8 MiB, faults through the
# syscall seam), then the Python ones (CUDA tensors, stream ordering, the adapters' replayed call orders).
step kv_store_test 150 env TMPDIR="$fast" "$bin/kv_store_test" --gtest_brief=1
step kv_faults_test 150 env TMPDIR="$fast" "$bin/kv_faults_test" --gtest_brief=1
step python_kv 240 env PYTHONPATH="$py" TMPDIR="$fast" python3 -m pytest -q -p no:cacheprovider -rs \
    python/tests/test_kv.py python/tests/test_kv_adapters_vllm.py python/tests/test_kv_adapters_lmcache.py \
    python/tests/test_kv_adapters_sglang.py python/tests/test_kv_adapters_e2e.py

# gdskit bench kv, blocks in GPU memory: every phase on the fast disk (raw ceiling, store, one-file-per-block
# baseline, kill -9, faults), and puts, cold gets and the baseline on the virtual disk.
TAIL=60 step bench_kv_fast 230 "$bin/gdskit" bench kv --dir "$fast" --capacity "${KV_CAPACITY_FAST:-3G}" --block-sizes 64K,2M,8M \
    "${gpu[@]}" --seconds 2 --threads 4 --kills 2
TAIL=40 step bench_kv_virtio 150 "$bin/gdskit" bench kv --dir "$slow" --capacity "${KV_CAPACITY_SLOW:-1G}" --block-sizes 64K,2M,8M \
    "${gpu[@]}" --seconds 2 --threads 4 --mix put,get,baseline

# The end-to-end run: a Llama-shaped model of random weights prefills the prompt; its KV cache goes through the
# store and back for the next turn (time to first token: recompute, store cold, torch.save/load cold).
step kv_e2e 150 env PYTHONPATH="$py" PYTHONUNBUFFERED=1 python3 scripts/kv-e2e.py --store "$fast" \
    --tokens "${KV_TOKENS:-16384}" --rounds 2 --json "$out/kv-e2e.json"

rm -rf "$slow"
note "== done in $((SECONDS - start)) s (budget $budget s)"
echo
cat "$summary"
