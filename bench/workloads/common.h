/* Shared helpers of the benchmark workloads: options, RNG, byte patterns, timing, /proc readings, RESULT output. */
#ifndef MALLARD_BENCH_COMMON_H
#define MALLARD_BENCH_COMMON_H

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Command-line parameters shared by every workload; each workload picks its own defaults. */
struct bench_opts {
  int threads;        /* -t: worker threads */
  long iters;         /* -n: iterations (operations per thread, rounds, ...) */
  long size;          /* -s: size parameter (slots, working-set objects, bytes, ...) */
  uint64_t seed;      /* -r: random seed */
  long corrupt_at;    /* -c: corrupt the pattern of the Nth filled object (0: never) */
  const char *mode;   /* -m: workload-specific mode */
  long wait_ms;       /* -w: workload-specific pause in milliseconds */
};

static inline void bench_usage(const char *prog, const char *what) {
  fprintf(stderr,
          "usage: %s [-t threads] [-n iterations] [-s size] [-r seed] [-m mode] [-w ms] [-c N]\n"
          "  %s\n"
          "  -c N deliberately corrupts the pattern of the Nth object filled, so the run must fail\n",
          prog, what);
}

static inline long bench_num(const char *s, const char *flag) {
  char *end = NULL;
  errno = 0;
  long v = strtol(s, &end, 0);
  if (errno || end == s || *end != '\0' || v < 0) {
    fprintf(stderr, "bench: bad value '%s' for %s (a non-negative integer is expected)\n", s, flag);
    exit(2);
  }
  return v;
}

static long bench_corrupt_at;          /* copy of opts.corrupt_at read by pat_fill */
static atomic_long bench_fill_count;   /* number of pattern fills so far (only counted when corrupting) */

static inline void bench_parse(int argc, char **argv, struct bench_opts *o, const char *what) {
  int c;
  while ((c = getopt(argc, argv, "t:n:s:r:c:m:w:h")) != -1) {
    switch (c) {
      case 't': o->threads = (int)bench_num(optarg, "-t"); break;
      case 'n': o->iters = bench_num(optarg, "-n"); break;
      case 's': o->size = bench_num(optarg, "-s"); break;
      case 'r': o->seed = (uint64_t)bench_num(optarg, "-r"); break;
      case 'c': o->corrupt_at = bench_num(optarg, "-c"); break;
      case 'm': o->mode = optarg; break;
      case 'w': o->wait_ms = bench_num(optarg, "-w"); break;
      case 'h': bench_usage(argv[0], what); exit(0);
      default: bench_usage(argv[0], what); exit(2);
    }
  }
  if (optind != argc) {
    bench_usage(argv[0], what);
    exit(2);
  }
  if (o->threads < 1) o->threads = 1;
  bench_corrupt_at = o->corrupt_at;
}

/* xorshift64*: a small, fast, per-thread generator; state must never be zero. */
static inline uint64_t rng_next(uint64_t *s) {
  uint64_t x = *s;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *s = x;
  return x * 0x2545F4914F6CDD1DULL;
}
static inline uint64_t rng_seed(uint64_t seed, uint64_t stream) {
  uint64_t s = (seed + 1) * 0x9E3779B97F4A7C15ULL ^ (stream + 1) * 0xBF58476D1CE4E5B9ULL;
  return s ? s : 1;
}
/* Uniform in [lo, hi]. */
static inline size_t rng_range(uint64_t *s, size_t lo, size_t hi) {
  return lo + (size_t)(rng_next(s) % (hi - lo + 1));
}
/* Log-uniform in [lo, hi]: every doubling is equally likely. */
static inline size_t rng_log(uint64_t *s, size_t lo, size_t hi) {
  int blo = 63 - __builtin_clzll(lo), bhi = 63 - __builtin_clzll(hi);
  int b = blo + (int)(rng_next(s) % (uint64_t)(bhi - blo + 1));
  size_t base = (size_t)1 << b;
  size_t v = base + (size_t)(rng_next(s) % base);
  if (v < lo) v = lo;
  if (v > hi) v = hi;
  return v;
}

/*
 * Byte patterns. An object of n bytes tagged with a 64-bit tag holds the tag in its first 8 bytes
 * (when n >= 8) and the tag's low byte everywhere else that is written. Objects up to PAT_FULL bytes
 * are written entirely; larger ones get their first and last 64 bytes and 16 bytes at the start of
 * every 4 KiB page, so every page is touched without the check dominating the run time.
 */
#define PAT_FULL 8192
#define PAT_PAGE 4096

static inline void bench_die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "CORRUPTION: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  fflush(stderr);
  _exit(3);
}

/* Out of line: inlined into callers with known sizes, gcc 12 warns falsely about the large-object ranges. */
__attribute__((noinline)) static void pat_set(unsigned char *p, size_t from, size_t to, uint64_t tag) {
  if (to <= from) return;
  if (from < 8) {
    unsigned char t[8];
    memcpy(t, &tag, 8);
    size_t e = to < 8 ? to : 8;
    memcpy(p + from, t + from, e - from);
    from = e;
  }
  if (to > from) memset(p + from, (int)(tag & 0xff), to - from);
}

/* Returns the first offset in [from, to) that does not hold the pattern, or to when all do. */
static inline size_t pat_scan(const unsigned char *p, size_t from, size_t to, uint64_t tag) {
  size_t i = from;
  unsigned char t[8];
  memcpy(t, &tag, 8);
  for (; i < to && i < 8; i++)
    if (p[i] != t[i]) return i;
  unsigned char b = (unsigned char)(tag & 0xff);
  uint64_t w = 0x0101010101010101ULL * b;
  for (; i < to && ((uintptr_t)(p + i) & 7); i++)
    if (p[i] != b) return i;
  for (; i + 8 <= to; i += 8) {
    uint64_t v;
    memcpy(&v, p + i, 8);
    if (v != w) break;
  }
  for (; i < to; i++)
    if (p[i] != b) return i;
  return to;
}

/* Calls fn on each byte range of an n-byte object that the pattern writes, clipped to [0, limit). */
#define PAT_FOR_RANGES(n, limit, FROM, TO, BODY)                                   \
  do {                                                                             \
    size_t n_ = (n), lim_ = (limit) < n_ ? (limit) : n_;                           \
    if (n_ <= PAT_FULL) {                                                          \
      size_t FROM = 0, TO = lim_;                                                  \
      BODY;                                                                        \
    } else {                                                                       \
      for (size_t pg_ = 0; pg_ < n_; pg_ += PAT_PAGE) {                            \
        size_t FROM = pg_, TO = pg_ + (pg_ == 0 ? 64 : 16);                        \
        if (TO > lim_) TO = lim_;                                                  \
        if (FROM < TO) { BODY; }                                                   \
      }                                                                            \
      size_t FROM = n_ - 64, TO = lim_;                                            \
      if (FROM < TO) { BODY; }                                                     \
    }                                                                              \
  } while (0)

static inline void pat_fill(void *ptr, size_t n, uint64_t tag) {
  unsigned char *p = ptr;
  PAT_FOR_RANGES(n, n, a, b, pat_set(p, a, b, tag));
  /* -c N: flip a written byte of the Nth object, which the check before its free must catch. */
  if (bench_corrupt_at && n && atomic_fetch_add(&bench_fill_count, 1) + 1 == bench_corrupt_at) p[n - 1] ^= 0x5a;
}

/* Checks the first `limit` bytes of an object written by pat_fill(p, n, tag); dies on a mismatch. */
static inline void pat_check_prefix(const void *ptr, size_t n, size_t limit, uint64_t tag, const char *where) {
  const unsigned char *p = ptr;
  PAT_FOR_RANGES(n, limit, a, b, {
    size_t bad = pat_scan(p, a, b, tag);
    if (bad != b)
      bench_die("%s: object %p of %zu bytes, byte %zu is 0x%02x (tag %016llx)", where, ptr, n, bad, p[bad],
                (unsigned long long)tag);
  });
}
static inline void pat_check(const void *p, size_t n, uint64_t tag, const char *where) {
  pat_check_prefix(p, n, n, tag, where);
}

/* A malloc that treats NULL as a failure of the run. */
static inline void *xmalloc(size_t n) {
  void *p = malloc(n);
  if (!p && n) {
    fprintf(stderr, "bench: malloc(%zu) failed\n", n);
    exit(4);
  }
  return p;
}

static inline double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Reads a "Key:   123 kB" line of /proc/self/status, in KiB (-1 when absent). */
static inline long proc_status_kib(const char *key) {
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  long v = -1;
  size_t kl = strlen(key);
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
      v = strtol(line + kl + 1, NULL, 10);
      break;
    }
  }
  fclose(f);
  return v;
}

static inline void bench_sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
  }
}

static inline void xpthread_create(pthread_t *t, void *(*fn)(void *), void *arg) {
  int e = pthread_create(t, NULL, fn, arg);
  if (e) {
    fprintf(stderr, "bench: pthread_create failed: %s\n", strerror(e));
    exit(4);
  }
}

/* Prints the one machine-readable line: RESULT {"workload": ..., <extra JSON fields>}. */
static inline void bench_result(const char *workload, const struct bench_opts *o, long ops, double seconds,
                                const char *extra_fmt, ...) {
  char extra[2048] = "";
  if (extra_fmt) {
    va_list ap;
    va_start(ap, extra_fmt);
    vsnprintf(extra, sizeof extra, extra_fmt, ap);
    va_end(ap);
  }
  printf("RESULT {\"workload\": \"%s\", \"threads\": %d, \"iters\": %ld, \"size\": %ld, \"ops\": %ld, "
         "\"seconds\": %.6f, \"ops_per_s\": %.1f, \"rss_end_kib\": %ld, \"hwm_kib\": %ld%s%s}\n",
         workload, o->threads, o->iters, o->size, ops, seconds, seconds > 0 ? (double)ops / seconds : 0.0,
         proc_status_kib("VmRSS"), proc_status_kib("VmHWM"), extra[0] ? ", " : "", extra);
  fflush(stdout);
}

#endif
