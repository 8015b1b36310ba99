#!/usr/bin/env bash
# gdskit version --settings: every setting with its value and where it came from; a GDSKIT_* variable shows as
# the environment, a malformed one is refused naming the variable.
# Usage: version_settings.sh <gdskit binary> <source dir> <build dir>
set -u
source "$(dirname "$0")/lib.bash" "$@"

out=$(env -u GDSKIT_THREADS -u GDSKIT_DIRECT "$gdskit" version --settings 2>&1) || fail "version --settings: $out"
for name in threads adaptive learn direct_depth chunk_bytes inline_bytes direct engine mode staging_slots \
            cached_slot_bytes staging_slot_bytes copy_kernel copy_kernel_bytes registered_staging; do
  printf '%s\n' "$out" | grep -Eq "^  $name +[^ ]+ +(default|environment|code)" || fail "no line for $name: $out"
done
printf '%s\n' "$out" | grep -Eq '^  threads +[0-9]+ +default$' || fail "threads not from its default: $out"

out=$(GDSKIT_THREADS=3 GDSKIT_DIRECT=off "$gdskit" version --settings 2>&1) || fail "with variables: $out"
printf '%s\n' "$out" | grep -Eq '^  threads +3 +environment \(GDSKIT_THREADS\)$' || fail "GDSKIT_THREADS: $out"
printf '%s\n' "$out" | grep -Eq '^  direct +off +environment \(GDSKIT_DIRECT\)$' || fail "GDSKIT_DIRECT: $out"

# A malformed variable is refused, naming it (exit 2: bad input).
err=$(GDSKIT_THREADS=0 "$gdskit" version --settings 2>&1 >/dev/null); rc=$?
[ $rc -eq 2 ] || fail "GDSKIT_THREADS=0 exited $rc"
printf '%s\n' "$err" | grep -q 'GDSKIT_THREADS' || fail "the bad variable is not named: $err"

# Without --settings, no settings lines.
out=$("$gdskit" version 2>&1) || fail "version: $out"
printf '%s\n' "$out" | grep -q '^settings' && fail "settings printed without --settings"
exit 0
