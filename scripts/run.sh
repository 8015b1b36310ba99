#!/usr/bin/env bash
# Sets up, builds, and runs the main job: gdskit doctor, then a short verified benchmark on a generated file
# in a temporary folder (GPU memory through the planner's path when a GPU is usable, host memory otherwise).
# Builds only the gdskit program (build/release; `pip install .` afterwards reuses it and compiles only the
# Python module). GDSKIT_BUILD_VERBOSE=1 shows every compiler line instead of steps and counts.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
echo "== [1/4] set-up: build dependencies from Debian"
scripts/setup.sh

py=/usr/bin/python3
[ -x "$py" ] || py=$(command -v python3)
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
echo "== [2/4] build the gdskit program (build/release, $(nproc) parallel jobs)"
"$py" build_backend/gdskit_build.py step "configure" -- cmake --preset release "${launcher[@]}"
"$py" build_backend/gdskit_build.py step "compile" -- cmake --build --preset release -j "$(nproc)" --target gdskit_cli
gdskit=build/release/apps/gdskit/gdskit
echo "   built in $((SECONDS - start)) s"

echo
echo "== [3/4] gdskit doctor"
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

echo "== [4/4] benchmark: write, every byte from a seeded pattern"
"$gdskit" bench -f "$work/bench.dat" -s "$per_worker" -i 1M -w 8 -I 1 -V "${target[@]}"
echo
echo "== [4/4] benchmark: read back cold (page cache dropped), verifying every byte"
"$gdskit" bench -f "$work/bench.dat" -s "$per_worker" -i 1M -w 8 -I 0 -V --cold "${target[@]}"
echo
echo "== done in $((SECONDS - start)) s; the gdskit program is $PWD/$gdskit"
echo "   (on PATH after \`pip install .\` in a virtual environment, which reuses this build, or"
echo "   \`cmake --install build/release --prefix ~/.local\`)"
