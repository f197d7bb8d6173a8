#!/bin/bash
# guard_sample_tsan.sh [OUT] — sampled guarded allocations under ThreadSanitizer: tests/secure/guard_stress.c (guarded
# blocks handed between threads, slots reused constantly; without its fork, which TSan does not support) against TSan-instrumented prefixed libraries of both
# variants (the ThreadSanitizer build of scripts/test.sh leaves tests/secure out). Any report fails.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$root/build-tsan-guard}
mkdir -p "$out"
cc=${CC:-cc}
flags=(-std=gnu11 -O1 -g -fsanitize=thread -fno-omit-frame-pointer -I"$root/include" -I"$root/src" -I"$root/tests/c")
srcs=$(sed -n '/set(MALLARD_CORE_SOURCES/,/)/p' "$root/src/CMakeLists.txt" | tr ' ()' '\n\n\n' | grep '\.c$')
for variant in fast secure; do
  defs=(-DMALLARD_STATS)
  [ "$variant" = secure ] && defs+=(-DMALLARD_SECURE)
  objs=()
  for s in $srcs api/api.c; do
    "$cc" "${flags[@]}" -fvisibility=hidden "${defs[@]}" -c "$root/src/$s" -o "$out/$variant-$(basename "${s%.c}").o"
    objs+=("$out/$variant-$(basename "${s%.c}").o")
  done
  "$cc" "${flags[@]}" -DMT_PREFIX -fno-builtin "$root/tests/secure/guard_stress.c" "${objs[@]}" \
    -o "$out/guard-stress-$variant" -lpthread -ldl
  echo "== $variant"
  GUARD_STRESS_NO_FORK=1 TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:history_size=4:suppressions=$root/tests/c/tsan.supp" \
    "$out/guard-stress-$variant"
done
