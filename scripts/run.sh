#!/usr/bin/env bash
# Sets up, builds, and runs the main job: gdskit doctor, then a short verified benchmark on a generated file
# in a temporary folder (GPU memory through the planner's path when a GPU is usable, host memory otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" --target gdskit_cli
gdskit=build/release/apps/gdskit/gdskit

echo
echo "== gdskit doctor"
doctor_rc=0
"$gdskit" doctor --no-color || doctor_rc=$?
case $doctor_rc in
  0) echo "(doctor: true GDS works here)" ;;
  1) echo "(doctor: no true GDS here; the benchmark below shows what does run)" ;;
  *) echo "(doctor could not finish; continuing with the benchmark)" ;;
esac

work=$(mktemp -d "${TMPDIR:-/var/tmp}/gdskit-run.XXXXXX")
trap 'rm -rf "$work"' EXIT
# -s is bytes per worker (as in gdsio): 8 workers x 128 MiB = 1 GiB by default.
per_worker=${GDSKIT_RUN_SIZE_PER_WORKER:-128M}

gpu_line=$("$gdskit" version | sed -n 's/^gpu: //p')
if [ "$doctor_rc" = 0 ]; then
  target=(-x gds -d 0)
  echo
  echo "== true GDS works here: benchmarking storage <-> GPU memory through cuFile's direct path"
elif [[ "$gpu_line" == yes* ]]; then
  target=(-x staged -d 0)
  echo
  echo "== a GPU is usable but not true GDS: benchmarking storage <-> GPU memory through gdskit's staged path"
else
  target=(-x host)
  echo
  why=${gpu_line#no }
  why=${why#(}
  why=${why%)}
  echo "== no usable GPU here ($why): benchmarking the host path (storage <-> host memory)"
fi

echo "== write, every byte from a seeded pattern"
"$gdskit" bench -f "$work/bench.dat" -s "$per_worker" -i 1M -w 8 -I 1 -V "${target[@]}"
echo
echo "== read back cold (page cache dropped), verifying every byte"
"$gdskit" bench -f "$work/bench.dat" -s "$per_worker" -i 1M -w 8 -I 0 -V --cold "${target[@]}"
echo
echo "== the gdskit program is $PWD/$gdskit"
echo "   (on PATH after \`pip install .\` in a virtual environment, or \`cmake --install build/release --prefix ~/.local\`)"
