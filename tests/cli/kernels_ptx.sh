#!/usr/bin/env bash
# The device kernels' PTX that the library embeds (src/gpu/*_ptx.hpp) is what scripts/gen-kernels.sh makes from
# src/gpu/kernels/*.cu today, and assembles for the oldest and newest GPUs gdskit supports. Skips (77) without a
# CUDA compiler.
# Usage: kernels_ptx.sh <gdskit binary> <source dir> <build dir>
set -u
source "$(dirname "$0")/lib.bash" "$@"
src=$2
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
ptxas=$(dirname "$nvcc")/ptxas
[ -x "$nvcc" ] && [ -x "$ptxas" ] || { echo "skipped: no CUDA compiler (nvcc, ptxas)"; exit 77; }

NVCC=$nvcc bash "$src/scripts/gen-kernels.sh" "$work" || fail "gen-kernels.sh failed"
n=0
for cu in "$src"/src/gpu/kernels/*.cu; do
  name=$(basename "$cu" .cu)
  header="$src/src/gpu/${name}_ptx.hpp"
  [ -f "$header" ] || fail "$name: no embedded PTX ($header): run scripts/gen-kernels.sh"
  cmp -s "$work/${name}_ptx.hpp" "$header" || fail "$name: the embedded PTX is not what $cu compiles to: run scripts/gen-kernels.sh"
  sed -n '/^inline constexpr char .*R"PTX($/,/^)PTX";$/p' "$header" | sed '1d;$d' > "$work/$name.ptx"
  grep -q '^\.version 7\.5$' "$work/$name.ptx" || fail "$name: PTX ISA version is not 7.5"
  for arch in sm_75 sm_86 sm_90; do
    "$ptxas" -arch="$arch" "$work/$name.ptx" -o "$work/$name.$arch.cubin" || fail "$name: ptxas -arch=$arch refused it"
  done
  n=$((n + 1))
done
[ $n -gt 0 ] || fail "no kernels found under src/gpu/kernels"
echo "kernels: $n checked"
exit 0
