#!/bin/bash
# tsan.sh [OUT] — the secure variant's cross-thread paths under ThreadSanitizer: tests/c/test_stress.c (remote frees
# clearing allocation bits, encrypted outbox batches, collection) against a TSan-instrumented prefixed secure library.
# The ThreadSanitizer build of scripts/test.sh (build-tsan) instruments the fast variant only. Any report fails.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$root/build-tsan-secure}
mkdir -p "$out"
cc=${CC:-cc}   # gcc on Debian: its libtsan is what the ThreadSanitizer build of scripts/test.sh uses too
flags=(-std=gnu11 -O1 -g -fsanitize=thread -fno-omit-frame-pointer -I"$root/include" -I"$root/src" -I"$root/tests/c")
srcs=$(sed -n '/set(MALLARD_CORE_SOURCES/,/)/p' "$root/src/CMakeLists.txt" | tr ' ()' '\n\n\n' | grep '\.c$')
objs=()
for s in $srcs api.c; do
  "$cc" "${flags[@]}" -fvisibility=hidden -DMALLARD_SECURE -DMALLARD_STATS ${MALLARD_RACE_DELAY:+-DMALLARD_RACE_DELAY} \
    -c "$root/src/$s" -o "$out/${s%.c}.o"
  objs+=("$out/${s%.c}.o")
done
"$cc" "${flags[@]}" -DMT_PREFIX -fno-builtin "$root/tests/c/test_stress.c" "${objs[@]}" -o "$out/secure-stress" -lpthread -ldl
TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:history_size=4:suppressions=$root/tests/c/tsan.supp" "$out/secure-stress"
