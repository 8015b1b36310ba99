# Shared by the tests/cli/*.sh scripts: source it with the script's arguments.
# Sets $gdskit (the CLI) and $work (a temporary folder removed on exit); skips (77) without the binary.
gdskit=$1
[ -x "$gdskit" ] || { echo "no gdskit binary at $gdskit"; exit 77; }
work=$(mktemp -d "${TMPDIR:-/tmp}/gdskit-cli-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# expect RC ARGS...: runs gdskit ARGS, wants exit RC and, for a failure, a reason on stderr.
expect() {
  local want=$1; shift
  local err rc
  err=$("$gdskit" "$@" 2>&1 >/dev/null)
  rc=$?
  [ $rc -eq "$want" ] || fail "gdskit $* exited $rc, want $want: $err"
  [ "$want" -eq 0 ] || [ -n "$err" ] || fail "gdskit $* printed no reason"
}

# limit_memory KIB: caps the memory of what this (sub)shell runs next. `ulimit -v` normally; sanitizer builds
# reserve terabytes of shadow address space, so there the sanitizer's own resident-memory cap does the job.
limit_memory() {
  if [ -n "${ASAN_OPTIONS:-}" ]; then
    export ASAN_OPTIONS="$ASAN_OPTIONS:hard_rss_limit_mb=$(($1 / 1024))"
  elif [ -n "${TSAN_OPTIONS:-}" ]; then
    export TSAN_OPTIONS="$TSAN_OPTIONS:hard_rss_limit_mb=$(($1 / 1024))"
  else
    ulimit -v "$1"
  fi
}
