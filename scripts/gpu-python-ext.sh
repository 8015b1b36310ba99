#!/usr/bin/env bash
# On a GPU machine: compiles the Python extension against that machine's Python and pybind11 and a carried static
# library (scripts/gpu-pack.sh), one compiler per source file at once, into OUT_DIR/gdskit.
#   scripts/gpu-python-ext.sh SOURCE_TREE LIB_DIR OUT_DIR
# LIB_DIR holds libgdskit.a (and liburing.a where the library links it); LIB_DIR/../include holds the generated
# gdskit/version.hpp.
set -uo pipefail
tree=${1:?usage: gpu-python-ext.sh SOURCE_TREE LIB_DIR OUT_DIR}
lib=${2:?usage: gpu-python-ext.sh SOURCE_TREE LIB_DIR OUT_DIR}
dst=${3:?usage: gpu-python-ext.sh SOURCE_TREE LIB_DIR OUT_DIR}
# OUT_DIR is replaced only when it is absent, empty, or an earlier output of this script (its marker file).
if [ -e "$dst" ] && [ -n "$(ls -A "$dst" 2>/dev/null)" ] && [ ! -f "$dst/.gdskit-python-ext" ]; then
  echo "gpu-python-ext: $dst exists and is not an earlier output of this script; give a new OUT_DIR" >&2
  exit 2
fi
rm -rf "$dst"
mkdir -p "$dst/obj"
: > "$dst/.gdskit-python-ext"
cp -r "$tree/python/gdskit" "$dst/"
inc=$(python3 -c 'import sysconfig;print(sysconfig.get_paths()["include"])')
pyb=$(python3 -c 'import pybind11;print(pybind11.get_include())' 2>/dev/null || echo /usr/include)
suffix=$(python3 -c 'import sysconfig;print(sysconfig.get_config_var("EXT_SUFFIX"))')
pids=()
for src in "$tree"/python/src/*.cpp; do
  g++ -O2 -std=c++20 -fPIC -fvisibility=hidden -I"$tree/include" -I"$lib/../include" -I"$tree/src" -I"$inc" -I"$pyb" \
      -DGDSKIT_VERSION_TEXT='"0.1.0"' -c "$src" -o "$dst/obj/$(basename "$src" .cpp).o" &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
[ $rc -eq 0 ] || { echo "gpu-python-ext: a source failed to compile" >&2; exit 1; }
uring=()
[ -f "$lib/liburing.a" ] && uring=("$lib/liburing.a")
g++ -shared "$dst"/obj/*.o "$lib/libgdskit.a" "${uring[@]}" -ldl -lpthread -o "$dst/gdskit/_gdskit$suffix"
