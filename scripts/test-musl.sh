#!/bin/sh
# scripts/test-musl.sh — builds Mallard against musl (Debian's musl-tools: musl-gcc) and runs its two musl suites:
#   static  — static musl programs linked with libmallard.a (ctest label musl-static);
#   dynamic — dynamic musl programs: libmallard.so / libmallard-secure.so preloaded, the prefixed libraries linked,
#             the tracer preloaded (every other test of that build);
#   pprof   — tests/pprof (pytest) on the musl build's programs, when .venv (scripts/setup.sh) is there.
# Needs only the Debian packages cmake, ninja-build (optional) and musl-tools. Exits non-zero when the configuration,
# the build or a suite fails, and names what failed. The build directory: $MALLARD_MUSL_BUILD_DIR, else build-musl/.
# docs/COMPATIBILITY.md, "musl", describes both routes. About 1.5 minutes on a 2-core machine.
set -u
cd "$(dirname "$0")/.." || exit 1
build=${MALLARD_MUSL_BUILD_DIR:-build-musl}
jobs=${JOBS:-2}

if ! command -v musl-gcc >/dev/null 2>&1; then
  echo "test-musl: musl-gcc not found (apt-get install musl-tools)" >&2
  exit 1
fi
if [ -f "$build/CMakeCache.txt" ] && ! grep -q '^CMAKE_C_COMPILER:[A-Z]*=.*musl-gcc$' "$build/CMakeCache.txt"; then
  echo "test-musl: $build was configured with another compiler; remove it or set MALLARD_MUSL_BUILD_DIR" >&2
  exit 1
fi
generator=
command -v ninja >/dev/null 2>&1 && generator="-G Ninja"

start=$(date +%s)
# shellcheck disable=SC2086  # $generator is empty or two words
if ! CC=musl-gcc cmake -S . -B "$build" $generator -DCMAKE_BUILD_TYPE=Release -DMALLARD_MUSL=ON; then
  echo "test-musl: FAILED: configuring $build with musl-gcc" >&2
  exit 1
fi
if ! cmake --build "$build" -j "$jobs"; then
  echo "test-musl: FAILED: building $build with musl-gcc" >&2
  exit 1
fi
built=$(date +%s)

failed=""
run_suite() {   # name, ctest label options...
  name=$1
  shift
  echo "== musl $name suite"
  if (cd "$build" && ctest "$@" -j "$jobs" --timeout 300 --output-on-failure); then
    echo "== musl $name suite: passed"
  else
    echo "== musl $name suite: FAILED" >&2
    failed="$failed $name"
  fi
}
run_suite static -L musl-static
run_suite dynamic -LE musl-static
# The pprof writer's tests against the musl build's programs (function names read from the dynamic symbol tables
# without dladdr1): when the project's Python environment is there (scripts/setup.sh; Go's pprof: golang-go).
python=${MALLARD_PYTHON:-.venv/bin/python}
if [ -x "$python" ] && "$python" -c "import pytest" 2>/dev/null; then
  echo "== musl pprof writer tests"
  case $build in /*) abs=$build ;; *) abs=$PWD/$build ;; esac
  if MALLARD_BUILD_DIR="$abs" "$python" -m pytest -q tests/pprof; then
    echo "== musl pprof writer tests: passed"
  else
    echo "== musl pprof writer tests: FAILED" >&2
    failed="$failed pprof"
  fi
else
  echo "== musl pprof writer tests: skipped ($python with pytest not found: scripts/setup.sh makes it)"
fi
end=$(date +%s)

echo "test-musl: build $((built - start)) s, tests $((end - built)) s"
if [ -n "$failed" ]; then
  echo "test-musl: FAILED suite(s):$failed" >&2
  exit 1
fi
echo "test-musl: both musl suites passed"
