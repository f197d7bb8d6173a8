/* faults.c — libmallard-faults.so: an mmap/mremap/madvise failure shim for the fault-injection test.
 *
 * Preload it after libmallard.so (LD_PRELOAD=libmallard.so:libmallard-faults.so) or into a program linked with
 * libmallard.a: libmallard's calls to mmap & co. are resolved in the global scope, where this library comes before
 * libc, so every one of them lands here (the counters prove it). It never allocates: the real calls are raw system
 * calls, so it cannot recurse into the allocator it is testing.
 *
 * MALLARD_FAULTS (read at start-up) or mallard_faults_set() (at run time) choose what fails:
 *   off              nothing (the default)
 *   nth=N            only the Nth call (1-based) after the setting
 *   after=N          every call after the first N (after=0: all of them)
 *   random=SEED:PM   each call with probability PM per mille, decided by SEED and the call's index (replayable)
 * optionally followed by ",ops=mmap+mremap+madvise" (the default: all three). A failed call returns the error the
 * kernel gives when memory runs out (ENOMEM; MAP_FAILED for mmap). Thread stacks (MAP_STACK) and file mappings are
 * never failed: the test is about the allocator, not about libc's own mappings. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

enum { F_OFF, F_NTH, F_AFTER, F_RANDOM };
enum { OP_MMAP = 1, OP_MREMAP = 2, OP_MADVISE = 4, OP_ALL = 7 };

static _Atomic(int) mode = F_OFF;
static _Atomic(int) ops = OP_ALL;
static _Atomic(unsigned long) param;        /* N, or the per-mille probability */
static _Atomic(unsigned long) seed;
static _Atomic(unsigned long) calls;        /* fail-able calls since the last setting */
static _Atomic(unsigned long) failed;       /* calls made to fail since the last setting */
static _Atomic(unsigned long) total_mmap;   /* every anonymous mmap seen since start-up (proves interposition) */
static _Atomic(int) configured;

static unsigned long parse_ul(const char **s) {
  unsigned long v = 0;
  while (**s >= '0' && **s <= '9') v = v * 10 + (unsigned long)(*(*s)++ - '0');
  return v;
}

/* Parses a specification (see above); returns 0, or -1 when it is malformed (then nothing fails). */
EXPORT int mallard_faults_set(const char *spec) {
  int m = F_OFF, o = OP_ALL;
  unsigned long p = 0, sd = 0;
  const char *s = spec ? spec : "off";
  if (!strncmp(s, "off", 3)) s += 3;
  else if (!strncmp(s, "nth=", 4)) { s += 4; m = F_NTH; p = parse_ul(&s); }
  else if (!strncmp(s, "after=", 6)) { s += 6; m = F_AFTER; p = parse_ul(&s); }
  else if (!strncmp(s, "random=", 7)) {
    s += 7;
    m = F_RANDOM;
    sd = parse_ul(&s);
    if (*s++ != ':') goto bad;
    p = parse_ul(&s);
  } else goto bad;
  if (!strncmp(s, ",ops=", 5)) {
    s += 5;
    o = 0;
    while (*s) {
      if (!strncmp(s, "mmap", 4)) { o |= OP_MMAP; s += 4; }
      else if (!strncmp(s, "mremap", 6)) { o |= OP_MREMAP; s += 6; }
      else if (!strncmp(s, "madvise", 7)) { o |= OP_MADVISE; s += 7; }
      else goto bad;
      if (*s == '+') s++;
    }
  }
  if (*s) goto bad;
  atomic_store(&mode, F_OFF);
  atomic_store(&calls, 0);
  atomic_store(&failed, 0);
  atomic_store(&param, p);
  atomic_store(&seed, sd);
  atomic_store(&ops, o);
  atomic_store(&mode, m);
  atomic_store(&configured, 1);
  return 0;
bad:
  atomic_store(&mode, F_OFF);
  atomic_store(&configured, 1);
  static const char msg[] = "libmallard-faults: bad MALLARD_FAULTS specification (see tests/fault/faults.c)\n";
  (void)!write(2, msg, sizeof msg - 1);
  return -1;
}

EXPORT unsigned long mallard_faults_calls(void) { return atomic_load(&calls); }
EXPORT unsigned long mallard_faults_failed(void) { return atomic_load(&failed); }
EXPORT unsigned long mallard_faults_total_mmap(void) { return atomic_load(&total_mmap); }

static void configure_once(void) {
  if (!atomic_load_explicit(&configured, memory_order_acquire)) mallard_faults_set(getenv("MALLARD_FAULTS"));
}

/* This library is initialised before libmallard.so when listed after it; a program linked with libmallard.a may
 * still allocate before this runs, hence configure_once() on every call as well. */
__attribute__((constructor)) static void faults_init(void) { configure_once(); }

static uint64_t mix(uint64_t x) {   /* splitmix64 finaliser */
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/* Decides whether this call fails, counting it. */
static int should_fail(int op) {
  configure_once();
  int m = atomic_load(&mode);
  if (m == F_OFF || !(atomic_load(&ops) & op)) return 0;
  unsigned long n = atomic_fetch_add(&calls, 1) + 1, p = atomic_load(&param);
  int fail = m == F_NTH ? n == p : m == F_AFTER ? n > p : (mix(atomic_load(&seed) ^ (n * 0x100000001b3ull)) % 1000) < p;
  if (fail) atomic_fetch_add(&failed, 1);
  return fail;
}

EXPORT void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
  if ((flags & MAP_ANONYMOUS) && !(flags & MAP_STACK)) {
    atomic_fetch_add(&total_mmap, 1);
    if (should_fail(OP_MMAP)) { errno = ENOMEM; return MAP_FAILED; }
  }
  return (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
}
#ifndef mmap64   /* musl: a macro naming mmap (nothing more to replace) */
EXPORT void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off)
    __attribute__((alias("mmap")));
#endif

EXPORT void *mremap(void *old, size_t old_len, size_t new_len, int flags, ...) {
  void *fixed = NULL;
  if (flags & MREMAP_FIXED) {
    va_list ap;
    va_start(ap, flags);
    fixed = va_arg(ap, void *);
    va_end(ap);
  }
  if (should_fail(OP_MREMAP)) { errno = ENOMEM; return MAP_FAILED; }
  return (void *)syscall(SYS_mremap, old, old_len, new_len, flags, fixed);
}

EXPORT int madvise(void *addr, size_t len, int advice) {
  if (should_fail(OP_MADVISE)) { errno = ENOMEM; return -1; }
  return (int)syscall(SYS_madvise, addr, len, advice);
}
