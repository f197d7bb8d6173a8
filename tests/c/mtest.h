/* mtest.h — shared helpers of the C tests: CHECK macros, the API-name switch (prefixed or replaced), /proc readers, RNG. */
#ifndef MTEST_H
#define MTEST_H

#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include "mallard.h"

/* Failures are counted (atomically: worker threads check too) and reported; main returns mt_result(). */
static _Atomic(int) mt_failures;
#define CHECK(cond, ...)                                                   \
  do {                                                                     \
    if (!(cond)) {                                                         \
      atomic_fetch_add(&mt_failures, 1);                                   \
      fprintf(stderr, "FAIL %s:%d: (%s) ", __FILE__, __LINE__, #cond);     \
      fprintf(stderr, __VA_ARGS__);                                        \
      fputc('\n', stderr);                                                 \
    }                                                                      \
  } while (0)
/* Stop the test when going on makes no sense (e.g. a NULL block would be dereferenced). */
#define REQUIRE(cond, ...)                                                 \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "FATAL %s:%d: (%s) ", __FILE__, __LINE__, #cond);    \
      fprintf(stderr, __VA_ARGS__);                                        \
      fputc('\n', stderr);                                                 \
      exit(1);                                                             \
    }                                                                      \
  } while (0)

static inline int mt_result(const char *name) {
  int f = atomic_load(&mt_failures);
  if (f) fprintf(stderr, "%s: %d check(s) failed\n", name, f);
  else printf("%s: all checks passed\n", name);
  return f ? 1 : 0;
}

/* API names: MT_PREFIX tests call mallard_* (libmallard-prefix.a); the others call the replaced malloc family,
 * either linked in statically (MT_STATIC, libmallard.a) or interposed with LD_PRELOAD (MT_PRELOAD). */
#ifdef MT_PREFIX
#define M_malloc mallard_malloc
#define M_free mallard_free
#define M_calloc mallard_calloc
#define M_realloc mallard_realloc
#define M_reallocarray mallard_reallocarray
#define M_aligned_alloc mallard_aligned_alloc
#define M_posix_memalign mallard_posix_memalign
#define M_memalign mallard_memalign
#define M_valloc mallard_valloc
#define M_pvalloc mallard_pvalloc
#define M_usable mallard_usable_size
#define M_free_sized mallard_free_sized
#define M_free_aligned_sized mallard_free_aligned_sized
#define MT_MODE "prefix"
#else
#include <malloc.h>
#define M_malloc malloc
#define M_free free
#define M_calloc calloc
#define M_realloc realloc
#define M_reallocarray reallocarray
#define M_aligned_alloc aligned_alloc
#define M_posix_memalign posix_memalign
#define M_memalign memalign
#define M_valloc valloc
#define M_usable malloc_usable_size
#ifdef MT_STATIC
#define MT_MODE "static"
#else
#define MT_MODE "preload"
#endif
#endif

/* Mallard's own control entry points. The LD_PRELOAD programs do not link libmallard: they look them up in the
 * process (found only if the preload really happened, which is what those tests must prove). */
#ifdef MT_PRELOAD
static inline void *mt_sym(const char *name) {
  void *s = dlsym(RTLD_DEFAULT, name);
  REQUIRE(s, "symbol %s not found: is libmallard.so really preloaded? (LD_PRELOAD=%s)", name,
          getenv("LD_PRELOAD") ? getenv("LD_PRELOAD") : "(unset)");
  return s;
}
#define MT_OWNS(p) (((bool (*)(const void *))mt_sym("mallard_owns"))(p))
#define MT_CTL(n, o, ol, nw, nl) \
  (((int (*)(const char *, void *, size_t *, void *, size_t))mt_sym("mallard_ctl"))(n, o, ol, nw, nl))
#define MT_COLLECT(f) (((void (*)(bool))mt_sym("mallard_collect"))(f))
#else
#define MT_OWNS(p) mallard_owns(p)
#define MT_CTL(n, o, ol, nw, nl) mallard_ctl(n, o, ol, nw, nl)
#define MT_COLLECT(f) mallard_collect(f)
#endif

/* glibc's extensions that Mallard defines on every C library (pvalloc, malloc_trim, mallopt) but musl neither
 * declares nor defines: declared here; a preloaded program cannot link them (its libc has none), so it looks them
 * up in the process, where libmallard.so exports them. */
#ifndef MT_PREFIX
#ifdef __GLIBC__
#define M_pvalloc pvalloc
#else
void *pvalloc(size_t size);
int malloc_trim(size_t pad);
int mallopt(int param, int value);
#ifdef MT_PRELOAD
#define M_pvalloc ((void *(*)(size_t))mt_sym("pvalloc"))
#define malloc_trim(pad) (((int (*)(size_t))mt_sym("malloc_trim"))(pad))
#define mallopt(param, value) (((int (*)(int, int))mt_sym("mallopt"))(param, value))
#else
#define M_pvalloc pvalloc
#endif
#endif
#endif

/* A field of /proc/self/status in KiB ("VmRSS:", "VmSize:"), read without allocating through stdio. */
static inline long mt_status_kb(const char *field) {
  char buf[8192];
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return -1;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  const char *p = strstr(buf, field);
  if (!p) return -1;
  return strtol(p + strlen(field), NULL, 10);
}

/* Runs the program `self` again with the NAME=VALUE settings of env (NULL-terminated) added to its environment,
 * its stderr captured into buf (cap bytes, NUL-terminated); returns its wait status, or -1 (no pipe or fork). */
static inline int mt_rerun(const char *self, const char *const *env, char *buf, size_t cap) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    dup2(fds[1], 2);
    close(fds[0]);
    for (; *env; env++) putenv((char *)*env);
    execl(self, self, (char *)NULL);
    _exit(127);
  }
  close(fds[1]);
  size_t len = 0;
  ssize_t r;
  while (len < cap - 1 && (r = read(fds[0], buf + len, cap - 1 - len)) > 0) len += (size_t)r;
  buf[len] = 0;
  close(fds[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  return st;
}

/* The page size the allocator must use: the kernel's, or a MALLARD_TEST_PAGE_SIZE build's when larger. */
static inline size_t mt_page(void) {
  size_t k = (size_t)sysconf(_SC_PAGESIZE);
#ifdef MALLARD_TEST_PAGE_SIZE
  if ((size_t)MALLARD_TEST_PAGE_SIZE > k) return MALLARD_TEST_PAGE_SIZE;
#endif
  return k;
}

static inline double mt_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* xorshift64*: small, fast, good enough to pick sizes and operations; never seeded with 0. */
typedef struct { uint64_t s; } mt_rng_t;
static inline void mt_rng_seed(mt_rng_t *r, uint64_t seed) {
  r->s = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
  if (!r->s) r->s = 1;
}
static inline uint64_t mt_rng_next(mt_rng_t *r) {
  r->s ^= r->s >> 12;
  r->s ^= r->s << 25;
  r->s ^= r->s >> 27;
  return r->s * 0x2545F4914F6CDD1Dull;
}
static inline uint64_t mt_rng_below(mt_rng_t *r, uint64_t n) { return n ? mt_rng_next(r) % n : 0; }

/* The same pointer, opaque to the compiler: lets a test look at a block after a realloc that must have failed
 * without tripping -Wuse-after-free. */
static inline void *mt_hide(void *p) {
  __asm__ volatile("" : "+r"(p));
  return p;
}

/* Byte pattern of a block: depends on its tag and the offset, so a block overwritten by another shows up. */
static inline uint8_t mt_pat(uint64_t tag, size_t i) { return (uint8_t)((tag * 131u) ^ (i * 7u) ^ (i >> 8)); }
static inline void mt_fill(void *p, size_t n, uint64_t tag) {
  uint8_t *b = p;
  for (size_t i = 0; i < n; i++) b[i] = mt_pat(tag, i);
}
/* Index of the first wrong byte, or n when all are right. */
static inline size_t mt_verify(const void *p, size_t n, uint64_t tag) {
  const uint8_t *b = p;
  for (size_t i = 0; i < n; i++)
    if (b[i] != mt_pat(tag, i)) return i;
  return n;
}

/* ---- memory-return helpers (VmRSS from /proc, heaps from mallard_ctl) ---- */
/* Waits up to `secs` without calling the allocator until VmRSS is at most `limit`; returns the last VmRSS. */
static inline long mt_wait_rss(long limit, double secs) {
  double t0 = mt_now();
  long rss = mt_status_kb("VmRSS:");
  while (rss > limit && mt_now() - t0 < secs) {
    usleep(50 * 1000);
    rss = mt_status_kb("VmRSS:");
  }
  return rss;
}

/* "Back near the start": 10% of the starting RSS plus `slack_kb`. */
static inline long mt_rss_limit(long rss0, long slack_kb) { return rss0 + rss0 / 10 + slack_kb; }

/* OS pages of [p, p + len) resident now (mincore over the pages it touches; at most 2 MiB and its two end pages);
 * *total: the pages looked at. No malloc (the prefix build's would be glibc's); the vector has a byte per 4 KiB
 * whatever the page (qemu-user at a larger emulated page has the host fill one byte per 4 KiB page). */
static inline size_t mt_resident_pages(const void *p, size_t len, size_t *total) {
  static unsigned char vec[(2 * 1024 * 1024 + 2 * 65536) / 4096];
  size_t pg = (size_t)sysconf(_SC_PAGESIZE), in = 0;
  uintptr_t lo = (uintptr_t)p & ~(uintptr_t)(pg - 1), hi = ((uintptr_t)p + len + pg - 1) & ~(uintptr_t)(pg - 1);
  REQUIRE(hi - lo <= sizeof vec * 4096 && mincore((void *)lo, hi - lo, vec) == 0, "mincore");
  *total = (hi - lo) / pg;
  for (size_t i = 0; i < *total; i++) in += vec[i] & 1;
  return in;
}

/* mallard_ctl reads of one type: the name must exist and answer with exactly that size. */
#define MT_CTL_READER(fn, T)                                                                      \
  static inline T fn(const char *name) {                                                          \
    T v = 0;                                                                                      \
    size_t len = sizeof v;                                                                        \
    REQUIRE(MT_CTL(name, &v, &len, NULL, 0) == 0 && len == sizeof v, "mallard_ctl(%s)", name);    \
    return v;                                                                                     \
  }
MT_CTL_READER(mt_ctl_size, size_t)
MT_CTL_READER(mt_ctl_u64, uint64_t)
MT_CTL_READER(mt_ctl_unsigned, unsigned)
MT_CTL_READER(mt_ctl_long, long)

/* stats.classes.<cls>.<what>, summed over the heaps. */
static inline uint64_t mt_class_stat(unsigned cls, const char *what) {
  char name[96];
  snprintf(name, sizeof name, "stats.classes.%u.%s", cls, what);
  return mt_ctl_u64(name);
}

/* The size class that serves `size`: the first whose block size holds it. */
static inline unsigned mt_class_of(size_t size) {
  for (unsigned c = 0;; c++) {
    char name[96];
    snprintf(name, sizeof name, "stats.classes.%u.size", c);
    size_t bs = 0, len = sizeof bs;
    REQUIRE(MT_CTL(name, &bs, &len, NULL, 0) == 0, "no size class holds %zu bytes", size);
    if (bs >= size) return c;
  }
}

/* Heaps attached to arenas (live threads' heaps), summed over the arenas. */
static inline unsigned mt_live_heaps(void) {
  unsigned n = 0, total = 0;
  size_t len = sizeof n;
  REQUIRE(MT_CTL("arenas.narenas", &n, &len, NULL, 0) == 0 && len == sizeof n, "arenas.narenas");
  for (unsigned i = 0; i < n; i++) {
    char name[64];
    unsigned t = 0;
    len = sizeof t;
    snprintf(name, sizeof name, "stats.arenas.%u.nthreads", i);
    REQUIRE(MT_CTL(name, &t, &len, NULL, 0) == 0 && len == sizeof t, "%s", name);
    total += t;
  }
  return total;
}

/* A stage that one thread announces and others wait for (owner ready, owner may go on): a counter under a mutex and a
 * condition variable. */
typedef struct mt_stage_s {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int stage;
} mt_stage_t;
#define MT_STAGE_INIT { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0 }
static inline void mt_stage_set(mt_stage_t *st, int s) {
  pthread_mutex_lock(&st->mu);
  st->stage = s;
  pthread_cond_broadcast(&st->cv);
  pthread_mutex_unlock(&st->mu);
}
static inline void mt_stage_wait(mt_stage_t *st, int s) {
  pthread_mutex_lock(&st->mu);
  while (st->stage < s) pthread_cond_wait(&st->cv, &st->mu);
  pthread_mutex_unlock(&st->mu);
}

/* Send this thread's outbox (its remote frees, batched per page) and empty its caches now. */
static inline void mt_flush_outbox(void) {
  REQUIRE(MT_CTL("thread.tcache.flush", NULL, NULL, NULL, 0) == 0, "thread.tcache.flush");
}

#endif
