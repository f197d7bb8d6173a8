#!/bin/sh
# check_hot_entries.sh — the hot entry points (malloc, free, calloc, new, sized delete) start a 64-byte line in each library.
# usage: check_hot_entries.sh LIB...
set -u
names="malloc free calloc _Znwm _Znam _ZdlPvm _ZdaPvm"
fail=0
for lib in "$@"; do
  for n in $names; do
    addr=$(nm -D --defined-only "$lib" | awk -v n="$n" '$3 == n { print $1; exit }')
    if [ -z "$addr" ]; then echo "FAIL: $lib does not export $n"; fail=1; continue; fi
    # the address's low 6 bits, from its last two hex digits
    low=$(( 0x$(echo "$addr" | tail -c 3) % 64 ))
    [ "$low" = 0 ] || { echo "FAIL: $lib: $n at 0x$addr, $low bytes into a line"; fail=1; }
  done
done
[ $fail = 0 ] && echo "hot entries: all checks passed"
exit $fail
