#!/usr/bin/env bash
# scripts/test-aarch64.sh — cross-builds Mallard for aarch64 (Debian's gcc-aarch64-linux-gnu) and runs its C tests under qemu-user (qemu-user-static).
# Four runs (docs/PLATFORMS.md, "aarch64"), each a ctest run whose programs ctest starts through
# `qemu-aarch64-static -L /usr/aarch64-linux-gnu` (CMAKE_CROSSCOMPILING_EMULATOR, cmake/toolchain-aarch64.cmake):
#   4k   — build-aarch64: the normal build, the whole C suite (tests/c, tests/fault, tests/control, tests/pprof,
#          tests/secure, tests/pagesize) but the tests qemu-user cannot run (the list below, each with its reason);
#   16k, 64k — build-aarch64-p16k, build-aarch64-p64k: test builds with MALLARD_TEST_PAGE_SIZE=16384 / 65536 (the
#          allocator takes that page on qemu's 4 KiB pages), the tests whose geometry follows the page (page_tests);
#   q64k — build-aarch64 again under qemu's own 64 KiB page (qemu -p 65536: the program reads AT_PAGESZ = 65536 and
#          mmap aligns to 64 KiB, as on a 64 KiB kernel), page_tests: the normal build finding the page at run time.
#          Skipped, with a note, where qemu does not act on -p (newer releases).
# Options: --full runs the whole suite in every run (the 4k run three more times); --runs "4k 16k 64k q64k" picks runs.
# Needs the Debian packages gcc-aarch64-linux-gnu (with libc6-dev-arm64-cross), qemu-user-static, cmake and
# ninja-build (optional). Exits non-zero when a configuration, a build or a test fails. About 5 minutes on a 2-core
# machine (docs/PLATFORMS.md has the figures); JOBS sets ctest's and the build's parallelism (default: nproc).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 1
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}
triple=aarch64-linux-gnu
sysroot=/usr/$triple
full=0
runs="4k 16k 64k q64k"
while [ $# -gt 0 ]; do
  case "$1" in
    --full) full=1 ;;
    --runs) runs=$2; shift ;;
    *) echo "usage: $0 [--full] [--runs \"4k 16k 64k q64k\"]" >&2; exit 2 ;;
  esac
  shift
done

missing=""
command -v "$triple-gcc" >/dev/null 2>&1 || missing="$missing gcc-aarch64-linux-gnu"
[ -e "$sysroot/lib/ld-linux-aarch64.so.1" ] || missing="$missing libc6-dev-arm64-cross"
qemu=$(command -v qemu-aarch64-static || command -v qemu-aarch64 || true)
[ -n "$qemu" ] || missing="$missing qemu-user-static"
command -v cmake >/dev/null 2>&1 || missing="$missing cmake"
if [ -n "$missing" ]; then
  echo "test-aarch64: missing tools (apt-get install$missing)" >&2
  exit 2
fi
generator=
command -v ninja >/dev/null 2>&1 && generator="-G Ninja"

# ---- tests qemu-user cannot run (evidence in docs/PLATFORMS.md, "What qemu-user does not show") ----
# exec: a test that re-executes itself (/proc/self/exe) needs the kernel to run an aarch64 ELF file, which only
# binfmt_misc with a qemu-aarch64 entry makes it do; without one execve fails with ENOEXEC (exit 127 in the child).
# tracer_variants: a host shell script that runs an aarch64 program itself (ctest prefixes only a test's own program
# with the emulator), which likewise needs binfmt_misc.
exec_tests='^c_foreign_|^c_init_nomem$|^c_first_call_preload$|^c_faults_init_sweep_|^c_prof_stacks_preload$|^tracer_variants$'
# rss: VmRSS and VmSize of the emulated process are qemu's: qemu keeps about 280 KiB per thread that ever ran and maps
# a 64 MiB malloc arena for some new threads, with glibc's malloc as much as with Mallard.
rss_tests='^c_churn_|^c_thread_virt_'
# placement: qemu picks the addresses of guest mappings itself; the test's set-up needs two mappings in a row to
# land side by side, below one another, as the kernel places them.
placement_tests='^c_owns_'
# robust: qemu answers set_robust_list with ENOSYS, so a thread that ends holding a robust mutex never makes it
# EOWNERDEAD: heaps made in the last TLS destructor round (found dead through their robust `life` mutex) stay.
robust_tests='^c_memory_idle_late_heaps_'
# rlimit: qemu accepts setrlimit(RLIMIT_AS) and limits nothing (it would limit qemu itself), so no ENOMEM comes.
rlimit_tests='^pprof_errors$'
# clone lock: qemu's lock around thread creation and thread exit, held by another thread at a fork, stays held in
# the child, whose first thread creation then hangs for ever, with any malloc (tests/c/test_model.c's side threads
# create threads while another forks, and its children start a thread). With MALLARD_TEST_QEMU set, test_model
# forks only while no thread starts or ends (docs/PLATFORMS.md); a test_model without that stays out.
# mincore (q64k only): qemu passes the guest's mincore to the host as it is, and the host writes one byte per 4 KiB
# page into a vector the program sized for its 64 KiB pages (past its end), so residency cannot be read there.
q64k_tests_out='^c_huge_from_untouched_'
export MALLARD_TEST_QEMU=1
exclude="$rss_tests|$placement_tests|$robust_tests|$rlimit_tests"
grep -q MALLARD_TEST_QEMU tests/c/test_model.c || exclude="$exclude|^c_model_"
# With a binfmt_misc entry for aarch64 (any name), re-executed programs run under qemu too: QEMU_LD_PREFIX tells
# that qemu where the aarch64 C library is.
binfmt=0
for f in /proc/sys/fs/binfmt_misc/*; do
  [ -f "$f" ] && grep -q '^enabled' "$f" 2>/dev/null && grep -qi 'aarch64' "$f" 2>/dev/null && binfmt=1
done
if [ "$binfmt" = 1 ]; then
  export QEMU_LD_PREFIX=$sysroot
else
  exclude="$exec_tests|$exclude"
fi

# The tests whose geometry follows the page (the 16k, 64k and q64k runs): API and sizes, huge blocks and their
# header, purging and memory return, ownership probes, fork, the secure variant (guard pages, slab guards, canaries),
# guarded samples, the page-size report, and the stress and hand-off tests that cross pages.
page_tests='^c_api_|^c_sizes_|^c_huge_|^c_memory_return_|^c_memory_paths_|^c_owner_probe_|^c_fork|^c_purge_wakeup_prefix$|^c_stress_prefix$|^c_handoff_prefix$|^c_internals$|^secure_|^guard_stress_|^page_size|^addr_bits$|^c_compat_symbols$|^control_'

start=$(date +%s)
failed=""
note=""

build() {   # dir, extra cmake arguments...
  local dir=$1
  shift
  echo "== configure and build $dir"
  mkdir -p "$dir"
  local log="$dir/test-aarch64"   # the logs stay only when a step fails
  # shellcheck disable=SC2086  # $generator is empty or two words
  if ! cmake -S . -B "$dir" $generator -DCMAKE_BUILD_TYPE=Release -DCMAKE_TOOLCHAIN_FILE="$root/cmake/toolchain-aarch64.cmake" \
       "$@" >"$log.configure.log" 2>&1; then
    cat "$log.configure.log"
    echo "test-aarch64: FAILED: configuring $dir" >&2
    return 1
  fi
  if ! cmake --build "$dir" -j "$jobs" >"$log.build.log" 2>&1; then
    grep -E 'error|FAILED' "$log.build.log" | head -40
    echo "test-aarch64: FAILED: building $dir" >&2
    return 1
  fi
  rm -f "$log.configure.log" "$log.build.log"
}

suite() {   # name, dir, ctest selection options...
  local name=$1 dir=$2
  shift 2
  echo "== aarch64 $name: ctest in $dir under $qemu${QEMU_PAGESIZE:+ (QEMU_PAGESIZE=$QEMU_PAGESIZE)}"
  local t0
  t0=$(date +%s)
  if (cd "$dir" && ctest "$@" -E "$exclude" -j "$jobs" --timeout 300 --output-on-failure); then
    echo "== aarch64 $name: passed in $(($(date +%s) - t0)) s"
  else
    failed="$failed $name"
  fi
}

selection() { if [ "$full" = 1 ]; then echo "-R ."; else echo "-R $page_tests"; fi; }

for run in $runs; do
  case "$run" in
    4k)
      build build-aarch64 -DMALLARD_TEST_PAGE_SIZE=0 || { failed="$failed 4k(build)"; continue; }
      # The preloaded tests must run Mallard: test_api asks the preloaded library for its statistics (dlsym of
      # mallard_ctl fails the test otherwise); this says so before the suite.
      # (Output captured first: with pipefail, grep -q closing the pipe early would fail the pipeline.)
      out=$(MALLARD_CONF=stats_print:true LD_PRELOAD="$root/build-aarch64/lib/libmallard.so" \
            "$qemu" -L "$sysroot" build-aarch64/bin/mallard-page-size 2>&1)
      if grep -q 'Mallard statistics' <<<"$out"; then
        echo "== aarch64: LD_PRELOAD reaches the guest's loader (libmallard.so printed its statistics)"
      else
        echo "test-aarch64: LD_PRELOAD=libmallard.so did not load Mallard into an aarch64 program under qemu" >&2
        failed="$failed 4k(preload)"
      fi
      suite 4k build-aarch64 -R . ;;
    16k|64k)
      ps=$(( ${run%k} * 1024 ))
      build "build-aarch64-p$run" -DMALLARD_TEST_PAGE_SIZE=$ps || { failed="$failed $run(build)"; continue; }
      # shellcheck disable=SC2046  # two words
      suite "$run" "build-aarch64-p$run" $(selection) ;;
    q64k)
      [ -f build-aarch64/CMakeCache.txt ] || build build-aarch64 -DMALLARD_TEST_PAGE_SIZE=0 ||
        { failed="$failed q64k(build)"; continue; }
      # qemu -p sets the page the program sees (QEMU 7.2); where it does not, this run would only repeat 4k.
      out=$(QEMU_PAGESIZE=65536 "$qemu" -L "$sysroot" "$sysroot/lib/ld-linux-aarch64.so.1" --list-diagnostics 2>/dev/null)
      if grep -q '^dl_pagesize=0x10000$' <<<"$out"; then
        all_out=$exclude
        exclude="$exclude|$q64k_tests_out"
        # shellcheck disable=SC2046
        QEMU_PAGESIZE=65536 suite q64k build-aarch64 $(selection)
        exclude=$all_out
      else
        note="$note; q64k skipped: $qemu ignores -p (QEMU_PAGESIZE)"
      fi ;;
    *) echo "test-aarch64: unknown run $run" >&2; exit 2 ;;
  esac
done

echo "== aarch64: $(($(date +%s) - start)) s in all${note}"
if [ -n "$failed" ]; then
  echo "test-aarch64: FAILED:$failed" >&2
  exit 1
fi
echo "test-aarch64: all runs passed ($runs)"
