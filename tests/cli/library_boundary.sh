#!/usr/bin/env bash
# The installed library and the tools stay apart: no folder includes one above it (scripts/check-layers.py),
# the export map is the public API of include/gdskit (scripts/check-exports.py; install_consumer.sh checks a
# built libgdskit.so against it), and no symbol of the command-line parser (CLI11) is in the core library.
set -euo pipefail
src=$2 build=$3
fail() { echo "FAIL: $*" >&2; exit 1; }

python3 "$src/scripts/check-layers.py" --root "$src"
python3 "$src/scripts/check-exports.py"

core=$(find "$build/src" -maxdepth 1 \( -name 'libgdskit.a' -o -name 'libgdskit.so.*.*.*' \) | head -1)
tools=$build/src/libgdskit_bench.a
[ -n "$core" ] || fail "no libgdskit.a or libgdskit.so.X.Y.Z under $build/src"
[ -f "$tools" ] || fail "no $tools"
core_syms=$(nm -C "$core" 2>/dev/null)
tools_syms=$(nm -C "$tools" 2>/dev/null)
grep -q 'gdskit::file_handle::' <<<"$core_syms" || fail "nm shows no gdskit symbol in $core"
# The control: the bench tool, which registers its flags on the parser, does hold CLI11's symbols, so the
# check can see them.
grep -q 'CLI::' <<<"$tools_syms" || fail "nm shows no CLI11 symbol in $tools (the check below would prove nothing)"
if grep -E '\bCLI::' <<<"$core_syms" | head -3 | grep .; then
  fail "$(basename "$core") holds CLI11 symbols: the command-line parser reached the core"
fi
echo "ok: $(basename "$core") has no CLI11 symbol"
