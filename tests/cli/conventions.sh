#!/usr/bin/env bash
# The conventions every subcommand shares: --version, and unknown commands or flags answered with the closest match.
# Usage: conventions.sh <gdskit binary> <source dir> <build dir>
set -u
source "$(dirname "$0")/lib.bash" "$@"

want_version=$("$gdskit" version | head -1)
[ -n "$want_version" ] || fail "gdskit version printed nothing"
for args in "--version" "-V" "doctor --version" "bench --version" "verify --version" "load --version" \
            "patch --version" "setup --version"; do
  out=$("$gdskit" $args 2>&1); rc=$?
  [ $rc -eq 0 ] || fail "gdskit $args exited $rc: $out"
  [ "$out" = "$want_version" ] || fail "gdskit $args printed '$out', want '$want_version'"
done

# suggest WANT ARGS...: gdskit ARGS exits 2 and names WANT as the closest match.
suggest() {
  local want=$1; shift
  local err rc
  err=$("$gdskit" "$@" 2>&1 >/dev/null); rc=$?
  [ $rc -eq 2 ] || fail "gdskit $* exited $rc, want 2: $err"
  grep -qF "did you mean '$want'?" <<<"$err" || fail "gdskit $*: no suggestion of $want: $err"
}
suggest doctor docter
suggest bench bnech -f x
suggest verify verfy
suggest --json verify --jsn
suggest --sizes verify --size 4K
suggest --checksum load --checksun x.safetensors
# Below commands that only group others, too, named with the command above.
suggest check patch chek
suggest plan setup plna
err=$("$gdskit" patch chek 2>&1); grep -q "^gdskit patch: unknown command 'chek'" <<<"$err" || fail "patch chek: $err"
# A flag of a nested command names the whole command.
mkdir -p "$work/src"
err=$("$gdskit" patch check --src "$work/src" --jsn 2>&1)
grep -q "^gdskit patch check: unknown flag '--jsn'; did you mean '--json'?" <<<"$err" || fail "patch check --jsn: $err"
expect 2 zzzzzzzz
expect 2 verify --zzzzzzzzzz
err=$("$gdskit" zzzzzzzz 2>&1); grep -q "unknown command 'zzzzzzzz'" <<<"$err" || fail "no reason: $err"
# A flag missing or misplaced is named with its command.
err=$("$gdskit" tune --all 2>&1); grep -q "^gdskit tune: --all requires --forget (gdskit tune --help lists the flags)$" <<<"$err" || fail "tune --all: $err"
err=$("$gdskit" patch check 2>&1); grep -q "^gdskit patch check: --src is required" <<<"$err" || fail "patch check: $err"
# Bytes from the command line are not echoed raw.
err=$("$gdskit" $'doc\033[2Jtor' 2>&1)
if printf '%s' "$err" | grep -q $'\033'; then fail "an escape sequence from argv reached the terminal"; fi
echo "ok"
