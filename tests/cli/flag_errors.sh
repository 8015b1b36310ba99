#!/usr/bin/env bash
# A flag given twice, a flag without its value, a number that is not one, a word outside a flag's set: every
# subcommand says it as gdskit says usage errors (the command, the flag by every name --help gives it, what was
# wrong, what it takes), never in the command-line parser's own words, and exits 2 before anything runs.
# The value flags are read from each command's --help, so a flag added later is checked too.
# Usage: flag_errors.sh <gdskit binary> <source dir> <build dir>
set -u
source "$(dirname "$0")/lib.bash" "$@"
cd "$work" || exit 1

# usage CMD ARGS...: stderr of `gdskit CMD ARGS...`, which must exit 2 and speak in gdskit's words.
usage() {
  local cmd=$1 out rc
  shift
  out=$("$gdskit" $cmd "$@" 2>&1 >/dev/null); rc=$?
  [ $rc -eq 2 ] || fail "gdskit $cmd $* exited $rc, want 2: $out"
  grep -q "^gdskit $cmd: " <<<"$out" || fail "gdskit $cmd $*: not named with its command: $out"
  if grep -qE "At (Most|least) [0-9]+ required|Could not convert|required [A-Z]+ missing|not in \{|is not an allowed value" \
       <<<"$out"; then
    fail "gdskit $cmd $*: the parser's words, not gdskit's: $out"
  fi
  printf '%s' "$out"
}
# has TEXT WORDS: TEXT holds WORDS.
has() { grep -qF -- "$2" <<<"$1" || fail "'$2' not said: $1"; }

commands=(doctor bench "bench kv" verify load tune "patch check" "patch apply" "patch revert" "patch diff"
          "patch registry-dwords" "setup plan" version)
checked=0
for cmd in "${commands[@]}"; do
  help=$("$gdskit" $cmd --help) || fail "$cmd --help exited $?"
  # "  -D,--dir TEXT=.   ..." or "  -s SIZE   ...": a flag with a value. Values that may be left out ([DEVICE])
  # and repeatable flags (TEXT ...) are not given once only.
  while read -r names type rest; do
    case $type in ''|Excludes:|Needs:|\[*) continue ;; esac
    case $rest in ...*) continue ;; esac
    flag=${names%%,*}
    shown=${names//,//}
    value=1
    [[ $type == *:\{* ]] && { value=${type#*:\{}; value=${value%%[,\}]*}; }
    e=$(usage "$cmd" "$flag" "$value" "$flag" "$value")
    has "$e" "gdskit $cmd: $shown given twice ($value, $value); it takes one value"
    e=$(usage "$cmd" "$flag")
    has "$e" "gdskit $cmd: $shown needs a value"
    checked=$((checked + 1))
  done < <(grep -E '^  -[^ ]+ [^ ]' <<<"$help")
done
[ $checked -ge 40 ] || fail "only $checked value flags found in the --help texts"

# Numbers: not a number, below or past the range of what the flag sets; never read as octal or wrapped around.
for f in -o -k; do
  has "$(usage verify "$f" abc -d cpu)" "gdskit verify: $f/--"
  has "$(usage verify "$f" 1e3 -d cpu)" "'1e3' is not a whole number"
  has "$(usage verify "$f" -1 -d cpu)" "'-1' is out of range (0 .. "
done
has "$(usage verify -o 0x10 -d cpu)" "gdskit verify: -o/--offset: '0x10' is not a whole number"
has "$(usage verify -o 9223372036854775808 -d cpu)" "'9223372036854775808' is out of range (0 .. 9223372036854775807)"
for f in --rank --split-dim; do
  has "$(usage load m.safetensors "$f" x)" "gdskit load: $f: 'x' is not a whole number"
  has "$(usage load m.safetensors "$f" 4294967296)" "'4294967296' is out of range (0 .. 4294967295)"
done
has "$(usage load m.safetensors --world x)" "gdskit load: --world: must be a whole number of at least 1"
has "$(usage load m.safetensors --world 4294967296)" "'4294967296' is out of range (1 .. 4294967295)"
has "$(usage load m.safetensors --rank -1)" "'-1' is out of range (0 .. 4294967295)"
for f in --threads --in-flight --batch --kills --gpu --seed; do
  has "$(usage "bench kv" --dir . "$f" abc)" "gdskit bench kv: $f: 'abc' is not a whole number"
done
for f in --seconds --zipf --get-fraction; do
  has "$(usage "bench kv" --dir . "$f" abc)" "gdskit bench kv: $f: 'abc' is not a number"
  has "$(usage "bench kv" --dir . "$f" nan)" "'nan' is not a number"
done
has "$(usage "bench kv" --dir . --threads -1)" "'-1' is out of range (0 .. 4294967295)"

# Words outside a flag's set.
has "$(usage "patch check" --src . --atomics foo)" "gdskit patch check: --atomics: 'foo' is not one of default, off"
has "$(usage "patch check" --src . --only foo)" "--only: 'foo' is not one of all, bif, hal"
has "$(usage "patch registry-dwords" --atomics foo)" "--atomics: 'foo' is not one of default, off"
has "$(usage "setup plan" --atomics foo)" "--atomics: 'foo' is not one of default, off"

# bench's own flags, and values that would otherwise be escaped twice or reach the terminal raw.
e=$(usage bench -f data -s 4G -s 5G)
has "$e" "gdskit bench: -s given twice (4G, 5G); it takes one value"
e=$(usage bench -f data -s 1 -s 2 -s 3)
has "$e" "-s given 3 times (1, 2, 3)"
e=$(usage bench -f "$work/a" -f $'b\033[2J' -s 4K)
has "$e" "-f given twice ($work/a, b\\x1b[2J)"
[ -z "$(ls -A "$work")" ] || fail "refused runs left files: $(ls "$work")"
echo "ok ($checked value flags)"
