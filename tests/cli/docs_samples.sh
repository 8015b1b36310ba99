#!/usr/bin/env bash
# The command outputs shown in docs/cli.md and docs/safetensors.md are what this program prints:
# scripts/doc-samples.py --check reruns every marked sample and fails on drift (it skips, 77, where a GPU is
# usable: the samples are those of a machine without one).
# Usage: docs_samples.sh <gdskit binary> <source dir> <build dir>
set -u
source "$(dirname "$0")/lib.bash" "$@"
command -v python3 >/dev/null || { echo "skipped: python3 is needed"; exit 77; }
# The samples ran in a folder that takes O_DIRECT (the build folder): where it is refused, the plan has other
# reasons.
if ! dd if=/dev/zero of="$3/.direct-probe.$$" bs=4096 count=1 oflag=direct status=none 2>/dev/null; then
  rm -f "$3/.direct-probe.$$"; echo "skipped: $3 refuses O_DIRECT"; exit 77
fi
rm -f "$3/.direct-probe.$$"
python3 "$2/scripts/doc-samples.py" --gdskit "$gdskit" --root "$2" --work "$3" --check
