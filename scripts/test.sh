#!/usr/bin/env bash
# Sets up, builds and runs every test. Each configuration is built once:
#   ci      optimised build of everything (library, tools, program, tests, benchmarks, examples and the Python
#           module, with pybind11's GIL assertions); ctest runs the unit, CLI, fuzz-corpus and packaging tests
#   python  `pip install .` into a fresh virtual environment from the ci build (nothing is compiled again), then
#           pytest runs python/tests against the installed package from a folder outside the checkout
#   asan    AddressSanitizer + UBSan: the unit, CLI and fuzz-corpus tests (but the CLI's wording checks)
#   tsan    ThreadSanitizer: the test programs that start threads (ctest label `threads`; the ci stage checks
#           that every program that starts a thread has it)
# GPU tests skip with their reason on a machine without a GPU. Each stage prints its time; a summary ends the run.
#   GDSKIT_SKIP_SANITIZERS=1   only the ci and python stages
#   GDSKIT_PYTHON=/path/python the interpreter of the virtual environment (default: /usr/bin/python3)
#   GDSKIT_BUILD_VERBOSE=1     every compiler line instead of steps and counts
#   JOBS=N                     parallel jobs (default: the number of CPUs)
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
scripts/setup.sh --tests

jobs=${JOBS:-$(nproc)}
py=${GDSKIT_PYTHON:-/usr/bin/python3}
[ -x "$py" ] || py=$(command -v python3)
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
work=
# Device profiles that the tests tune or learn go here, never into the user's cache folder.
profiles=$(mktemp -d "${TMPDIR:-/tmp}/gdskit-test-profiles.XXXXXX")
export XDG_CACHE_HOME=$profiles
trap '[ -z "$work" ] || rm -rf "$work"; rm -rf "$profiles"' EXIT

# The CPU seconds the finished commands of this script used (user + system), from the shell's `times`: with the
# wall time it says how much of a stage was waiting for a loaded machine.
cpu_seconds() {
  # Sets cpu_now. `times` in a pipe or $(...) would report a subshell's children: it writes to a file.
  times >"$profiles/times"
  cpu_now=$(tail -1 "$profiles/times" | tr -d s |
    awk '{ n = 0; for (i = 1; i <= 2; i++) { split($i, p, "m"); n += p[1] * 60 + p[2] } printf "%d", n }')
}
run_start=$SECONDS
stage_start=$SECONDS
stage_cpu=0
summary=()
stage_done() {
  local took=$((SECONDS - stage_start)) cpu
  cpu_seconds
  cpu=$((cpu_now - stage_cpu))
  summary+=("$(printf '%-7s %5d s  (CPU %5d s)' "$1" "$took" "$cpu")")
  echo "== $1: done in $took s, CPU $cpu s (load average $(cut -d' ' -f1-3 /proc/loadavg))"
  stage_start=$SECONDS
  stage_cpu=$cpu_now
}
# step LABEL COMMAND...: a build step shown as a count of what is done, its compiler lines only on failure.
step() {
  local label=$1
  shift
  "$py" build_backend/gdskit_build.py step "$label" -- "$@"
}

# configure PRESET [cmake arguments...]. Unity builds: each configuration is built once from nothing, where a
# few large translation units take about half the time of one per source.
configure() {
  local preset=$1
  shift
  step "$preset: configure" cmake --preset "$preset" "${launcher[@]}" -DGDSKIT_UNITY_BUILD=ON "$@"
}

# The ci stage. GDSKIT_THREAD_PROBE records which test programs start threads (tests/support/thread_probe.c).
echo "== ci: configure and build (library, tools, program, tests, benchmarks, examples, Python module)"
configure ci -DGDSKIT_BUILD_PYTHON=ON -DGDSKIT_PYTHON_GIL_CHECKS=ON -DPython3_EXECUTABLE="$py" \
  -DGDSKIT_THREAD_PROBE=ON
rm -f build/ci/threaded-programs.log
step "ci: build" cmake --build --preset ci -j "$jobs"
echo "== ci: test"
ctest --preset ci -j "$jobs" --timeout 900 --no-tests=error
# Every test program that started a thread must be one the ThreadSanitizer stage runs.
missing=()
mapfile -t threaded < build/ci/threaded-tests.txt
# No record at all means the probe was not loaded, not that no test starts a thread.
[ -s build/ci/threaded-programs.log ] ||
  { echo "ci: the thread probe recorded no program (build/ci/threaded-programs.log)" >&2; exit 1; }
while read -r exe; do
  name=$(basename "$exe")
  [ "$(dirname "$exe")" = "$src/build/ci/tests" ] || continue
  [[ " ${threaded[*]} " == *" $name "* ]] || missing+=("$name")
done < <(sort -u build/ci/threaded-programs.log)
if [ ${#missing[@]} -gt 0 ]; then
  echo "ci: ${missing[*]} start threads but are not in GDSKIT_THREADED_TESTS (tests/CMakeLists.txt)," \
       "so ThreadSanitizer would not run them" >&2
  exit 1
fi
stage_done ci

# The documented install, from this checkout, into a new environment, built in the ci build folder (the
# module and the program are already there: pip only packs and installs them). The tests then import the
# installed package from a folder outside the checkout, so the build tree cannot stand in for it.
echo "== python: pip install . into a fresh virtual environment"
work=$(mktemp -d "${TMPDIR:-/tmp}/gdskit-pytest.XXXXXX")
# --system-site-packages: the tests use Debian's numpy and torch (and pytest) where they are installed.
"$py" -m venv --system-site-packages "$work/venv"
GDSKIT_BUILD_DIR=$src/build/ci PIP_DISABLE_PIP_VERSION_CHECK=1 "$work/venv/bin/pip" install -q "$src"
vpy=$work/venv/bin/python
(
  cd "$work"
  "$vpy" -c 'import gdskit, sys; f = gdskit.__file__; print("gdskit", gdskit.__version__, "from", f);
sys.exit(0 if f.startswith(sys.prefix) else "gdskit was not imported from the environment")'
  "$work/venv/bin/gdskit" version | head -1
  echo "== python: tests against the installed package"
  rc=0
  "$vpy" -m pytest -q -p no:cacheprovider --rootdir "$work" "$src/python/tests" || rc=$?
  # 5: nothing was collected, which means the tests were not found, not that they passed.
  [ "$rc" = 5 ] && echo "python: no tests ran" >&2
  [ "$rc" = 0 ] || { echo "== python: tests failed (status $rc)" >&2; exit 1; }
)
stage_done python

if [ "${GDSKIT_SKIP_SANITIZERS:-0}" != 1 ]; then
  echo "== asan: configure and build (AddressSanitizer + UBSan)"
  configure asan
  step "asan: build" cmake --build --preset asan -j "$jobs"
  echo "== asan: test"
  # Not here: the CLI tests that check words (every flag's usage errors, the docs' sample outputs, the
  # conventions of --help and --version) by starting the program hundreds of times, which under ASan costs a
  # third of a second each; they run in the ci stage, and the code they reach runs here through the others.
  ctest --preset asan -j "$jobs" --timeout 900 --no-tests=error -E '^cli_(flag_errors|docs_samples|conventions)$'
  stage_done asan

  # ThreadSanitizer where threads are: the test programs that start them, and nothing else is built.
  echo "== tsan: configure and build the test programs that start threads (ThreadSanitizer)"
  configure tsan
  mapfile -t targets < build/tsan/threaded-tests.txt
  step "tsan: build" cmake --build --preset tsan -j "$jobs" --target "${targets[@]}"
  echo "== tsan: test"
  ctest --preset tsan -j "$jobs" --timeout 900 --no-tests=error -L threads
  stage_done tsan
fi
cpu_seconds
echo "== all tests passed in $((SECONDS - run_start)) s, CPU $cpu_now s, on $(nproc) CPUs:"
printf '   %s\n' "${summary[@]}"
