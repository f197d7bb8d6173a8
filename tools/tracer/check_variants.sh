#!/bin/sh
# check_variants.sh — the tracer counts each malloc-family call of the variants program once, whatever the C library
# (musl's calloc, memalign, posix_memalign and valloc call malloc or aligned_alloc by their exported names, which
# lead back into the tracer). usage: check_variants.sh libmallard-tracer.so mallard-testprog-variants
set -u
dir=$(mktemp -d) || exit 1
trap 'rm -rf "$dir"' EXIT
MALLARD_TRACE_DIR="$dir" LD_PRELOAD="$1" "$2" >/dev/null || { echo "FAIL: $2 under the tracer"; exit 1; }
set -- "$dir"/trace.*.json
[ $# = 1 ] && [ -f "$1" ] || { echo "FAIL: want one record, got: $*"; exit 1; }
# The process totals come first: one call of each variant (free: the seven blocks).
want='"calloc": 1, "realloc": 0, "free": 7, "aligned_alloc": 1, "posix_memalign": 1, "memalign": 1, '
want="$want"'"valloc": 1, "pvalloc": 1, "reallocarray": 1}'
if grep -qF "$want" "$1"; then
  echo "tracer variants: all checks passed"
else
  echo "FAIL: the calls are not counted once each:"; head -c 600 "$1"; echo; exit 1
fi
