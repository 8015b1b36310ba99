#!/usr/bin/env bash
# Progress on stderr: percentage, rate and ETA on a terminal, rate-limited and cleared at the end; nothing when
# stderr is not a terminal or with --json, unless --progress asks; --no-progress silences a terminal.
# Usage: progress.sh <gdskit binary> <source dir> <build dir>
set -u
source "$(dirname "$0")/lib.bash" "$@"

head -c 1048576 /dev/zero >"$work/data"
timed=(bench -f "$work/data" -s 1M -i 4K -T 1.5)
sizes=$(printf '16M,%.0s' {1..15})16M

# Not a terminal: silent unless asked.
"$gdskit" "${timed[@]}" >/dev/null 2>"$work/err" || fail "timed bench exited $?"
[ ! -s "$work/err" ] || fail "progress on a pipe without --progress: $(cat "$work/err")"
"$gdskit" "${timed[@]}" --progress >/dev/null 2>"$work/err" || fail "bench --progress exited $?"
grep -q '^bench  .*/s$' "$work/err" || fail "bench --progress printed no progress lines: $(cat "$work/err")"
[ "$(wc -l <"$work/err")" -le 3 ] || fail "more than one line a second into a file: $(cat "$work/err")"
grep -q $'\r' "$work/err" && fail "carriage returns in a file"
"$gdskit" verify --host -D "$work" --sizes "$sizes" --progress >/dev/null 2>"$work/err" || fail "verify --progress"
grep -q '^verify .*%.*ETA' "$work/err" || echo "note: verify ran under 0.2 s, no progress line to check"

# On a terminal (script(1) gives the command one).
if command -v script >/dev/null && script -qec true /dev/null >/dev/null 2>&1; then
  tty_run() { script -qec "$*" /dev/null </dev/null; }
  out=$(tty_run "'$gdskit' ${timed[*]} 2>&1 >/dev/null")
  grep -q $'\r''bench  .*/s' <<<"$out" || fail "no progress on a terminal: $(printf '%q' "$out")"
  # The line ends blank: the last thing written is spaces and a carriage return.
  tail=$(printf '%s' "$out" | tr -d '\n' | awk -F'\r' '{print $(NF-1)}')
  [ -z "$(tr -d ' ' <<<"$tail")" ] || fail "the progress line is not cleared at the end: $(printf '%q' "$out")"
  out=$(tty_run "'$gdskit' verify --host -D '$work' --sizes $sizes 2>&1 >/dev/null")
  grep -q 'verify .*%.*/s  ETA' <<<"$out" || echo "note: verify ran under 0.2 s on the terminal"
  out=$(tty_run "'$gdskit' ${timed[*]} --json 2>&1 >/dev/null")
  [ -z "$(tr -d '\r\n' <<<"$out")" ] || fail "progress with --json: $(printf '%q' "$out")"
  out=$(tty_run "'$gdskit' ${timed[*]} --no-progress 2>&1 >/dev/null")
  [ -z "$(tr -d '\r\n' <<<"$out")" ] || fail "progress with --no-progress: $(printf '%q' "$out")"
else
  echo "note: no script(1): terminal cases skipped"
fi
echo "ok"
