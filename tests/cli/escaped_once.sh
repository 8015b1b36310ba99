#!/usr/bin/env bash
# A hostile path (a backslash and a newline in a folder's name) or setting value in an error: shown escaped
# exactly once (\\ and \n, as the library writes them into its messages), never raw and never escaped again by
# the command that prints the message (\\\\ and \\n).
# Usage: escaped_once.sh <gdskit binary> <source dir> <build dir>
set -u
source "$(dirname "$0")/lib.bash" "$@"

dir="$work/we\\ird"$'\n'"name"
shown="$work/we\\\\ird\\nname"  # the folder as printable() writes it: we\\ird\nname
mkdir -p "$dir"

# once TEXT WANT: TEXT holds WANT and no doubled escape of it.
once() {
  grep -qF -- "$2" <<<"$1" || fail "'$2' not in: $1"
  ! grep -qF -- '\\\\' <<<"$1" || fail "escaped twice: $1"
  ! grep -qF -- '\\n' <<<"$1" || fail "escaped twice: $1"
}

# A write that fails during the run (past `ulimit -f`): the library's message names the file, escaped once.
err=$(ulimit -f 64; "$gdskit" bench -f "$dir/big" -s 1M -i 64K -I 1 --quiet 2>&1 >/dev/null); rc=$?
[ $rc -eq 3 ] || fail "write past ulimit -f exited $rc, want 3: $err"
once "$err" "gdskit bench: ftruncate \"$shown/big\""

# --save into a missing folder: the folder in the library's detail, escaped once.
h='{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}'
printf "\\x$(printf %02x ${#h})\\0\\0\\0\\0\\0\\0\\0%s\\x2a" "$h" >"$work/one.safetensors"
err=$("$gdskit" load "$work/one.safetensors" --save "$dir/no/out.safetensors" 2>&1 >/dev/null); rc=$?
[ $rc -eq 2 ] || fail "load --save into a missing folder exited $rc, want 2: $err"
once "$err" "--save \"$shown/no/out.safetensors\": its folder $shown/no does not exist"

# Paths a command prints on stdout: escaped once too, so that a newline or an escape sequence in a folder's name
# neither forges a line nor drives the terminal. load --save names the file it wrote; tune its folder and the
# profile it saved (tune needs O_DIRECT, which tmpfs refuses).
out=$("$gdskit" load "$work/one.safetensors" --save "$dir/out.safetensors" 2>&1); rc=$?
[ $rc -eq 0 ] || fail "load --save into a hostile folder exited $rc: $out"
once "$out" "saved 1 B to $shown/out.safetensors (1 file(s))"
if dd if=/dev/zero of="$dir/probe" bs=4096 count=1 oflag=direct status=none 2>/dev/null; then
  rm -f "$dir/probe"
  out=$(XDG_CACHE_HOME="$dir/cache" "$gdskit" tune --path "$dir" -s 1M --no-write 2>&1); rc=$?
  [ $rc -eq 0 ] || fail "tune in a hostile folder exited $rc: $out"
  once "$out" "measuring 1.00 MiB per point in $shown"
  once "$out" "profile: $shown/cache/gdskit/profile-"
else
  echo "tune not checked: $work refuses O_DIRECT"
fi

# A bad setting: the library writes the value's backslash as \x5c; every command shows it so.
for cmd in "bench -f $work/one.safetensors -s 1 -i 1" "verify --host --sizes 4K -D $work" "load $work/one.safetensors" \
           "bench kv --dir $work --mix put" "tune --path $work -s 1M"; do
  err=$(GDSKIT_ENGINE='fa\st' "$gdskit" $cmd 2>&1 >/dev/null); rc=$?
  [ $rc -ne 0 ] || fail "$cmd with a bad setting exited 0: $err"
  grep -qF 'setting GDSKIT_ENGINE="fa\x5cst": expected one of' <<<"$err" || fail "$cmd: $err"
done
echo "ok"
