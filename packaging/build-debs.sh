#!/usr/bin/env bash
# Builds the Debian packages libmallard0, libmallard-dev, mallard and mallard-global: bash packaging/build-debs.sh [BUILD_DIR]
# They land in BUILD_DIR/debs (default build-deb/debs); install with: apt-get install ./build-deb/debs/*.deb
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(realpath -m "${1:-$root/build-deb}")
cmake -S "$root" -B "$out" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr \
  -DMALLARD_BUILD_TESTS=OFF -DMALLARD_INSTALL_GLOBAL=ON -DMALLARD_PACKAGE_CLI=ON >/dev/null
cmake --build "$out" -j "$(nproc 2>/dev/null || echo 2)" >/dev/null
rm -rf "$out/debs"
(cd "$out" && cpack -G DEB >/dev/null)
ls "$out"/debs/*.deb
