#!/bin/bash
# tsan.sh [OUT] — the secure variant's cross-thread paths under ThreadSanitizer: tests/c/test_stress.c (remote frees:
# remote bits, summaries, collection), tests/secure/remote_bits_stress.c (frees into the same bitmap words while the
# owner collects), tests/secure/owed_summary_stress.c (owed summary bits on pages of 2 and 16 slots) and
# tests/c/test_owner_probe.c (mallard_owns while huge blocks are moved away as they are freed) against a
# TSan-instrumented prefixed secure library.
# The ThreadSanitizer build of scripts/test.sh (build-tsan) instruments the fast variant only. Any report fails.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$root/build-tsan-secure}
mkdir -p "$out"
cc=${CC:-cc}   # gcc on Debian: its libtsan is what the ThreadSanitizer build of scripts/test.sh uses too
flags=(-std=gnu11 -O1 -g -fsanitize=thread -fno-omit-frame-pointer -I"$root/include" -I"$root/src" -I"$root/tests/c")
srcs=$(sed -n '/set(MALLARD_CORE_SOURCES/,/)/p' "$root/src/CMakeLists.txt" | tr ' ()' '\n\n\n' | grep '\.c$')
objs=()
for s in $srcs api/api.c; do
  "$cc" "${flags[@]}" -fvisibility=hidden -DMALLARD_SECURE -DMALLARD_STATS ${MALLARD_RACE_DELAY:+-DMALLARD_RACE_DELAY} \
    -c "$root/src/$s" -o "$out/$(basename "${s%.c}").o"
  objs+=("$out/$(basename "${s%.c}").o")
done
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:history_size=4:suppressions=$root/tests/c/tsan.supp"
"$cc" "${flags[@]}" -DMT_PREFIX -fno-builtin "$root/tests/c/test_stress.c" "${objs[@]}" -o "$out/secure-stress" -lpthread -ldl
"$out/secure-stress"
"$cc" "${flags[@]}" -DMALLARD_SECURE -DMALLARD_STATS "$root/tests/secure/remote_bits_stress.c" "${objs[@]}" \
  -o "$out/secure-remote-bits" -lpthread -ldl
MALLARD_CONF=guard_sample:0,background_thread:false "$out/secure-remote-bits"   # small pages, no sweep
# A word whose summary bit waits in an outbox is not collected, whatever the page geometry (docs/OPTIONS.md's example).
"$cc" "${flags[@]}" -DMALLARD_SECURE -DMALLARD_STATS "$root/tests/secure/owed_summary_stress.c" "${objs[@]}" \
  -o "$out/secure-owed-summary" -lpthread -ldl
MALLARD_CONF='guard_sample:0,dirty_decay_ms:0,slab_sizes:1-1024:2|8K-64K:16' "$out/secure-owed-summary"
MALLARD_CONF='guard_sample:0,dirty_decay_ms:0' "$out/secure-owed-summary"
# mallard_owns probing huge blocks that the huge cache moves away (mremap) as they are freed, and large blocks.
"$cc" "${flags[@]}" -DMT_PREFIX -fno-builtin "$root/tests/c/test_owner_probe.c" "${objs[@]}" -o "$out/secure-owner-probe" -lpthread -ldl
MALLARD_CONF=large_quarantine:0 "$out/secure-owner-probe"
