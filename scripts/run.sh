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
size=${GDSKIT_RUN_SIZE:-1G}

if "$gdskit" version | grep -q '^gpu: yes'; then
  target=(-x auto -d 0)
  echo
  echo "== a GPU is usable: benchmarking file <-> GPU memory through the planner's path"
else
  target=(-x host)
  echo
  echo "== no usable GPU here ($("$gdskit" version | sed -n 's/^gpu: //p')): benchmarking the host path"
fi

echo "== write $size with verification pattern"
"$gdskit" bench -f "$work/bench.dat" -s "$size" -i 1M -w 8 -I 1 -V "${target[@]}"
echo "== read it back, verifying every byte"
"$gdskit" bench -f "$work/bench.dat" -s "$size" -i 1M -w 8 -I 0 -V "${target[@]}"
