#!/usr/bin/env bash
# The test command: set up, build (normal and sanitizer), then run ctest and pytest; exits non-zero on any failure.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
jobs=$(nproc 2>/dev/null || echo 2)

bash scripts/setup.sh || exit 1
set -e
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$jobs"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DMALLARD_SANITIZE=ON >/dev/null
cmake --build build-asan -j "$jobs"
# Race-window widening: the allocator pauses wherever a block or page changes hands (docs/TESTING.md).
cmake -S . -B build-race -G Ninja -DCMAKE_BUILD_TYPE=Release -DMALLARD_RACE_DELAY=ON -DMALLARD_BUILD_TESTS=ON >/dev/null
cmake --build build-race -j "$jobs"
set +e

status=0
# One-way layers (src/LAYERS): no #include of a higher layer's header, no object referring to a higher layer's symbol.
echo "== layers (scripts/check_layers.py)"
python3 scripts/check_layers.py --objects build/src/CMakeFiles/mallard.dir --objects build/src/CMakeFiles/mallard-secure.dir \
  --objects build/src/CMakeFiles/mallard-prefix.dir || status=1
echo "== ctest (release build)"
ctest --test-dir build --output-on-failure -j "$jobs" || status=1
echo "== ctest (ASan+UBSan build, prefixed API)"
ctest --test-dir build-asan --output-on-failure -L prefix -j "$jobs" || status=1
echo "== ctest (race-delay build: multi-threaded tests)"
ctest --test-dir build-race --output-on-failure -j "$jobs" -R 'stress|model|churn|owner|memory_paths|memory_idle|fork|no_thread|double|wakeup|succession|handoff|reclaim|hand_over|purge_unlocked|claim|take_idle' || status=1
# ---- ThreadSanitizer: the multi-threaded tests through the prefixed API, in a build directory of their own
# (tests/c/tsan.supp lists the only suppressions: documented intentionally racy reads). ----
echo "== ctest (ThreadSanitizer build, multi-threaded prefixed-API tests)"
if cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMALLARD_TSAN=ON >/dev/null &&
   cmake --build build-tsan -j "$jobs"; then
  ctest --test-dir build-tsan --output-on-failure -L tsan -j "$jobs" || status=1
else
  echo "the ThreadSanitizer build failed"
  status=1
fi
echo "== ThreadSanitizer: the secure variant's cross-thread paths (tests/secure/tsan.sh)"
bash tests/secure/tsan.sh "$root/build-tsan-secure" || status=1
echo "== ThreadSanitizer: sampled guarded allocations (tests/secure/guard_sample_tsan.sh)"
bash tests/secure/guard_sample_tsan.sh "$root/build-tsan-guard" || status=1
# ---- end of the ThreadSanitizer block ----
# ---- page sizes (docs/DESIGN.md "Page size"): the C suite and the secure variant's misuse tests in test builds that
# take 16 and 64 KiB pages on this 4 KiB kernel (MALLARD_TEST_PAGE_SIZE), as aarch64 kernels have them. ----
for ps in 16384 65536; do
  dir="build-p$((ps / 1024))k"
  echo "== ctest and secure misuse tests at $((ps / 1024)) KiB pages ($dir)"
  if cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMALLARD_TEST_PAGE_SIZE=$ps >/dev/null &&
     cmake --build "$dir" -j "$jobs" >/dev/null; then
    ctest --test-dir "$dir" --output-on-failure -j "$jobs" || status=1
    MALLARD_BUILD_DIR="$root/$dir" .venv/bin/pytest -q -p no:cacheprovider tests/secure || status=1
  else
    echo "the $((ps / 1024)) KiB page build failed"
    status=1
  fi
done
# ---- end of the page-size block ----
# ---- musl (docs/COMPATIBILITY.md): libmallard built with musl-gcc; static musl programs with libmallard.a, dynamic
# ones with libmallard.so preloaded (scripts/test-musl.sh). ----
echo "== musl: static and dynamic suites (scripts/test-musl.sh)"
bash scripts/test-musl.sh || status=1
# ---- aarch64 (docs/PLATFORMS.md): cross-built with gcc-aarch64-linux-gnu, the C suite under qemu-user at 4 KiB and
# at 16 and 64 KiB pages (scripts/test-aarch64.sh). ----
echo "== aarch64 under qemu-user (scripts/test-aarch64.sh)"
bash scripts/test-aarch64.sh || status=1
# ---- clang (the standard: -Wall -Wextra -Werror clean with gcc and clang): every target built with clang, then
# the C suite. ----
echo "== clang: every target, and ctest (build-clang)"
if CC=clang CXX=clang++ cmake -S . -B build-clang -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null &&
   cmake --build build-clang -j "$jobs" >/dev/null; then
  ctest --test-dir build-clang --output-on-failure -j "$jobs" || status=1
else
  echo "the clang build failed"
  status=1
fi
echo "== pytest"
MALLARD_BUILD_DIR="$root/build" .venv/bin/pytest -q -ra tests/ || status=1
# ---- Rust crates (bindings/rust, issue 9): cargo test of both variants, then cargo package (no publishing) ----
cargo_bin=$(command -v cargo || true)
for c in "${HOME:-/root}/.cargo/bin/cargo" /root/.cargo/bin/cargo; do
  [ -z "$cargo_bin" ] && [ -x "$c" ] && cargo_bin=$c
done
if [ -z "$cargo_bin" ] && [ "$(id -u)" = 0 ]; then
  apt-get install -y -qq --no-install-recommends cargo >/dev/null && cargo_bin=$(command -v cargo || true)
fi
# rustup's proxies look for their toolchains under $HOME: with another HOME (CI's fresh one), use root's.
if [ -n "$cargo_bin" ] && ! "$cargo_bin" --version >/dev/null 2>&1 && [ -d /root/.rustup ]; then
  export RUSTUP_HOME=/root/.rustup
fi
echo "== cargo test (bindings/rust)"
if [ -z "$cargo_bin" ]; then
  echo "cargo is missing: install Rust (rustup) or run as root to install Debian's cargo" >&2
  status=1
else
  (cd bindings/rust && "$cargo_bin" test -q && "$cargo_bin" test -q --features mallard/secure \
     && "$cargo_bin" package -q --workspace --allow-dirty) || status=1
fi
# ---- end of the Rust block ----
exit $status
