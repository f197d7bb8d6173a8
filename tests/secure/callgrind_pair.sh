#!/bin/bash
# callgrind_pair.sh LIB [SIZE] — instructions per malloc/free pair under LIB (LD_PRELOAD): the difference between
# 2,000,000 and 1,000,000 pairs divided by 1,000,000, so start-up costs cancel out.
set -euo pipefail
lib=$1; size=${2:-32}
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
cc -O2 -o "$dir/loop" "$(dirname "$0")/pair_loop.c"
count() {
  valgrind --tool=callgrind --trace-children=yes --callgrind-out-file="$dir/out.$1.%p" \
    env LD_PRELOAD="$lib" "$dir/loop" "$1" "$size" >/dev/null 2>&1
  cat "$dir"/out."$1".* | grep '^summary:' | awk '{print $2}' | sort -n | tail -1
}
a=$(count 1000000); b=$(count 2000000)
echo "$(( (b - a) / 1000000 ))"
