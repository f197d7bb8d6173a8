#!/bin/sh
# check_compat_symbols.sh — jemalloc's and glibc's introspection names: exported by the replacing libraries, absent from libmallard-prefix.a.
# usage: check_compat_symbols.sh libmallard.so libmallard-secure.so libmallard-prefix.a
set -u
names="mallctl mallctlnametomib mallctlbymib malloc_stats_print mallinfo2 mallinfo malloc_stats malloc_info mallopt"
fail=0
for lib in "$1" "$2"; do
  for n in $names; do
    nm -D --defined-only "$lib" | grep -q " T $n\$" || { echo "FAIL: $lib does not export $n"; fail=1; }
  done
done
for n in $names; do
  if nm --defined-only "$3" 2>/dev/null | grep -q " [TW] $n\$"; then echo "FAIL: $3 defines $n"; fail=1; fi
done
[ $fail = 0 ] && echo "compat symbols: all checks passed"
exit $fail
