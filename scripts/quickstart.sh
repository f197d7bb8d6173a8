#!/usr/bin/env bash
# Quick start: set up, build Mallard, then compare every allocator on this machine on the built-in workload.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc 2>/dev/null || echo 2)"
mkdir -p results
MALLARD_BUILD_DIR="$root/build" exec .venv/bin/mallard demo --plot results/demo.png "$@"
