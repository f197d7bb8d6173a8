/* test_faults.c — drives every allocator entry point while libmallard-faults.so makes mmap/mremap/madvise fail:
 * each call returns a valid block or NULL with errno ENOMEM (never a crash, never a bad block), a failed realloc
 * leaves the old block intact, nothing leaks, and everything works again once the failures stop.
 *
 * Usage: test_faults init | init-sweep | nth [,ops=...] | after [,ops=...] | random [SEED] | recover (init-sweep's)
 * Run under LD_PRELOAD=[libmallard.so:]libmallard-faults.so; MALLARD_FAULTS sets the failures at start-up. */
#include "mtest.h"
#include <malloc.h>
#include <pthread.h>
#include <sys/wait.h>

#define KiB ((size_t)1024)
#define MiB ((size_t)1024 * 1024)

static int (*faults_set)(const char *);
static unsigned long (*faults_calls)(void);
static unsigned long (*faults_failed)(void);
static unsigned long (*faults_total_mmap)(void);
static int (*ctl)(const char *, void *, size_t *, void *, size_t);
static void (*collect)(bool);
static bool (*owns)(const void *);
static const char *self_path;

static void resolve(void) {
  faults_set = (int (*)(const char *))dlsym(RTLD_DEFAULT, "mallard_faults_set");
  faults_calls = (unsigned long (*)(void))dlsym(RTLD_DEFAULT, "mallard_faults_calls");
  faults_failed = (unsigned long (*)(void))dlsym(RTLD_DEFAULT, "mallard_faults_failed");
  faults_total_mmap = (unsigned long (*)(void))dlsym(RTLD_DEFAULT, "mallard_faults_total_mmap");
  REQUIRE(faults_set && faults_calls && faults_failed && faults_total_mmap,
          "libmallard-faults.so is not preloaded (LD_PRELOAD=%s)", getenv("LD_PRELOAD") ? getenv("LD_PRELOAD") : "");
#ifdef MT_PRELOAD
  ctl = (int (*)(const char *, void *, size_t *, void *, size_t))mt_sym("mallard_ctl");
  collect = (void (*)(bool))mt_sym("mallard_collect");
  owns = (bool (*)(const void *))mt_sym("mallard_owns");
#else
  ctl = mallard_ctl;
  collect = mallard_collect;
  owns = mallard_owns;
#endif
}

static void set_faults(const char *spec) { REQUIRE(faults_set(spec) == 0, "bad spec %s", spec); }

/* Outcome of one call that may fail: a good block of at least n bytes aligned to al, or NULL + ENOMEM. Returns
 * whether the block is usable; with strict (no failures active) NULL is an error too. */
static bool judge(void *p, int err, size_t n, size_t al, bool strict, const char *what) {
  if (!p) {
    CHECK(err == ENOMEM, "%s(%zu) = NULL with errno %d, want ENOMEM", what, n, err);
    CHECK(!strict, "%s(%zu) = NULL after the failures stopped", what, n);
    return false;
  }
  CHECK(((uintptr_t)p & ((al < 16 ? 16 : al) - 1)) == 0, "%s(%zu) = %p misaligned (%zu)", what, n, p, al);
  CHECK(owns(p), "%s(%zu) = %p is not Mallard's", what, n, p);
  size_t u = M_usable(p);
  CHECK(u >= n, "%s(%zu): usable %zu", what, n, u);
  return u >= n;
}

enum { MAXLIVE = 64 };
typedef struct { void *p; size_t n; uint64_t tag; } live_t;

/* Patterns on the first and last 4 KiB only (and everything of a small block): enough to see a block lost or
 * overwritten, at a cost that lets the test run hundreds of rounds. */
#define ENDS (4 * KiB)
static void fill(void *p, size_t n, uint64_t tag) {
  if (n <= 2 * ENDS) { mt_fill(p, n, tag); return; }
  mt_fill(p, ENDS, tag);
  mt_fill((uint8_t *)p + n - ENDS, ENDS, tag + 1);
}
/* Index of the first wrong byte of the first `n` (the tail only when the block is at least `full` long), or n. */
static size_t verify(const void *p, size_t n, size_t full, uint64_t tag) {
  if (full <= 2 * ENDS) return mt_verify(p, n, tag);
  size_t h = mt_verify(p, n < ENDS ? n : ENDS, tag);
  if (h < (n < ENDS ? n : ENDS)) return h;
  if (n < full) return n;   /* a shrunk block: its head was checked */
  size_t t = mt_verify((const uint8_t *)p + full - ENDS, ENDS, tag + 1);
  return t < ENDS ? full - ENDS + t : n;
}

/* Records a block that was granted, filled with the pattern of its tag. */
static void keep_block(live_t *lv, int *k, void *p, size_t n, uint64_t tag0) {
  uint64_t tag = 2 * (tag0 + (uint64_t)*k);
  fill(p, n, tag);
  lv[(*k)++] = (live_t){ p, n, tag };
}

/* Allocates through every plain entry point; returns the blocks it got, filled with their patterns. */
static int alloc_all(live_t *lv, bool strict, uint64_t tag0) {
  static const size_t sizes[] = { 24, 700, 20000, 200 * KiB, 1500 * KiB, 5 * MiB };
  int k = 0;
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    size_t n = sizes[i];
    errno = 0;
    void *p = M_malloc(n);
    if (judge(p, errno, n, 16, strict, "malloc")) keep_block(lv, &k, p, n, tag0);
    errno = 0;
    uint8_t *z = M_calloc(1, n);
    if (judge(z, errno, n, 16, strict, "calloc")) {
      size_t bad = n;
      for (size_t j = 0; j < n; j += 61) if (z[j]) { bad = j; break; }
      CHECK(bad == n, "calloc(1, %zu): byte %zu not zero", n, bad);
      keep_block(lv, &k, z, n, tag0);
    }
  }
  static const size_t aligns[] = { 64, 4096, 64 * KiB, 2 * MiB, 8 * MiB };
  for (size_t i = 0; i < sizeof aligns / sizeof aligns[0]; i++) {
    size_t n = 3000 + aligns[i] / 2;
    errno = 0;
    void *p = M_aligned_alloc(aligns[i], n);
    if (judge(p, errno, n, aligns[i], strict, "aligned_alloc")) keep_block(lv, &k, p, n, tag0);
    void *q = NULL;
    int rc = M_posix_memalign(&q, aligns[i], n / 2);
    CHECK((rc == 0) == (q != NULL) && (rc == 0 || rc == ENOMEM), "posix_memalign = %d", rc);
    if (judge(q, rc ? ENOMEM : 0, n / 2, aligns[i], strict, "posix_memalign")) keep_block(lv, &k, q, n / 2, tag0);
  }
  return k;
}

/* realloc in every direction: grown and shrunk across small, medium, large and huge, and huge to a bigger huge. */
static void realloc_all(live_t *lv, int k, bool strict) {
  static const size_t targets[] = { 40, 30000, 600 * KiB, 6 * MiB, 12 * MiB, 5 * MiB, 300 * KiB, 100, 16 };
  for (int i = 0; i < k; i++) {
    size_t n = targets[(size_t)i % (sizeof targets / sizeof targets[0])];
    void *keep = mt_hide(lv[i].p);
    errno = 0;
    void *q = M_realloc(lv[i].p, n);
    size_t common = lv[i].n < n ? lv[i].n : n;
    if (judge(q, errno, n, 16, strict, "realloc")) {
      CHECK(verify(q, common, lv[i].n, lv[i].tag) == common, "realloc(%zu -> %zu) lost contents", lv[i].n, n);
      fill(q, n, lv[i].tag);
      lv[i].p = q;
      lv[i].n = n;
    } else {
      CHECK(verify(keep, lv[i].n, lv[i].n, lv[i].tag) == lv[i].n, "a failed realloc(%zu -> %zu) damaged the block",
            lv[i].n, n);
    }
  }
}

static void free_all(live_t *lv, int k) {
  for (int i = 0; i < k; i++) {
    CHECK(verify(lv[i].p, lv[i].n, lv[i].n, lv[i].tag) == lv[i].n, "block %d (%zu bytes) damaged", i, lv[i].n);
    M_free(lv[i].p);
  }
}

static void *thread_round(void *arg) {
  bool strict = (bool)(uintptr_t)arg;
  live_t lv[MAXLIVE];
  int k = alloc_all(lv, strict, 5000);
  realloc_all(lv, k, strict);
  free_all(lv, k);
  return NULL;
}

/* One round over every entry point, plus collect, a thread and a fork. */
static void round_all(bool strict) {
  live_t lv[MAXLIVE];
  int k = alloc_all(lv, strict, 100);
  realloc_all(lv, k, strict);
  collect(true);   /* purging under failing madvise */
  pthread_t t;
  int rc = pthread_create(&t, NULL, thread_round, (void *)(uintptr_t)strict);
  CHECK(rc == 0 || (!strict && rc == EAGAIN), "pthread_create = %d", rc);
  if (rc == 0) pthread_join(t, NULL);
  int failures_before = atomic_load(&mt_failures);
  pid_t pid = fork();
  if (pid == 0) {
    thread_round((void *)(uintptr_t)strict);   /* the child under the same failures, then without */
    faults_set("off");
    thread_round((void *)1);
    _exit(atomic_load(&mt_failures) != failures_before ? 1 : 0);
  }
  CHECK(pid > 0, "fork failed: errno %d", errno);
  if (pid > 0) {
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "forked child: status 0x%x (signal %d)", st,
          WIFSIGNALED(st) ? WTERMSIG(st) : 0);
  }
  free_all(lv, k);
}

static size_t allocated(void) {
  size_t v = 0, len = sizeof v;
  int rc = ctl("stats.allocated", &v, &len, NULL, 0);
  REQUIRE(rc == 0 && len == sizeof v, "mallard_ctl(stats.allocated) = %d", rc);
  return v;
}

static unsigned long total_failed;   /* calls the shim made fail, over the whole scenario */

/* Failures under `spec`, then full recovery. */
static void faulty_then_recover(const char *spec) {
  set_faults(spec);
  round_all(false);
  total_failed += faults_failed();
  set_faults("off");
  round_all(true);
}

static void check_no_leak(size_t base, const char *scenario) {
  collect(true);
  size_t now = allocated();
  CHECK(now <= base + 256 * KiB, "%s: stats.allocated %zu -> %zu after everything was freed (a leak)", scenario, base,
        now);
}

/* Counts the fail-able calls of one clean round (nothing fails: after=huge). */
static unsigned long calls_per_round(void) {
  set_faults("after=1000000000");
  round_all(true);
  unsigned long n = faults_calls();
  set_faults("off");
  return n;
}

/* Re-runs this program ("recover") with MALLARD_FAULTS=spec from the very start; it must exit 0. */
static void spawn_recover(const char *spec) {
  pid_t pid = fork();
  if (pid == 0) {
    setenv("MALLARD_FAULTS", spec, 1);
    execl(self_path, self_path, "recover", (char *)NULL);
    _exit(127);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "MALLARD_FAULTS=%s from start-up: status 0x%x (signal %d)", spec, st,
        WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

int main(int argc, char **argv) {
  const char *what = argc > 1 ? argv[1] : "";
  self_path = "/proc/self/exe";
  if (!strcmp(what, "init") || !strcmp(what, "recover")) {
    /* Failures active since start-up (MALLARD_FAULTS): nothing here may print or resolve before the checks. */
    faults_set = (int (*)(const char *))dlsym(RTLD_DEFAULT, "mallard_faults_set");
    if (!strcmp(what, "init")) {
      /* after=0: no mapping was ever granted, so every call must fail cleanly. */
      static const size_t sizes[] = { 1, 100, 20000, 300 * KiB, 5 * MiB };
      for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        errno = 0;
        void *p = M_malloc(sizes[i]);
        CHECK(p == NULL && errno == ENOMEM, "malloc(%zu) = %p errno %d with every mmap failing", sizes[i], p, errno);
        errno = 0;
        p = M_calloc(1, sizes[i]);
        CHECK(p == NULL && errno == ENOMEM, "calloc(1, %zu) = %p errno %d", sizes[i], p, errno);
        errno = 0;
        p = M_realloc(NULL, sizes[i]);
        CHECK(p == NULL && errno == ENOMEM, "realloc(NULL, %zu) = %p errno %d", sizes[i], p, errno);
        errno = 0;
        p = M_aligned_alloc(4096, sizes[i]);
        CHECK(p == NULL && errno == ENOMEM, "aligned_alloc(4096, %zu) = %p errno %d", sizes[i], p, errno);
        void *q = NULL;
        CHECK(M_posix_memalign(&q, 64, sizes[i]) == ENOMEM && !q, "posix_memalign(64, %zu)", sizes[i]);
      }
    } else {
      resolve();
      round_all(false);
    }
    REQUIRE(faults_set, "libmallard-faults.so is not preloaded");
    faults_set("off");
    resolve();
    size_t base = allocated();
    round_all(true);
    round_all(true);
    check_no_leak(base, what);
    return mt_result(what);
  }
  resolve();
  M_free(M_malloc(1));
  printf("test_faults %s (%s build)\n", what, MT_MODE);
  unsigned long seen = faults_total_mmap();
  void *big = M_malloc(64 * MiB);
  REQUIRE(big, "malloc(64M)");
  M_free(big);
  REQUIRE(faults_total_mmap() > seen, "libmallard's mmap calls do not reach the shim (interposition failed)");
  size_t base = allocated();
  unsigned long per_round = calls_per_round();
  printf("%lu fail-able calls in one round\n", per_round);
  REQUIRE(per_round > 0, "a round made no mmap/mremap/madvise call");
  char spec[96];
  /* nth / after: an optional second argument restricts the failing calls (e.g. ",ops=madvise"). */
  const char *ops = argc > 2 && strcmp(what, "random") ? argv[2] : "";
  if (!strcmp(what, "nth")) {
    for (unsigned long n = 1; n <= per_round + 2; n++) {
      snprintf(spec, sizeof spec, "nth=%lu%s", n, ops);
      faulty_then_recover(spec);
    }
  } else if (!strcmp(what, "after")) {
    for (unsigned long n = 0; n <= per_round + 2; n += 1 + n / 4) {
      snprintf(spec, sizeof spec, "after=%lu%s", n, ops);
      faulty_then_recover(spec);
    }
  } else if (!strcmp(what, "random")) {
    unsigned long seed = argc > 2 ? strtoul(argv[2], NULL, 10) : (unsigned long)time(NULL);
    printf("seed %lu (replay: test_faults random %lu)\n", seed, seed);
    static const char *const opsets[] = { "", ",ops=mmap", ",ops=mremap", ",ops=madvise" };
    for (unsigned i = 0; i < 24; i++) {
      snprintf(spec, sizeof spec, "random=%lu:%u%s", seed + i, 100 + 100 * (i % 8), opsets[i % 4]);
      faulty_then_recover(spec);
    }
  } else if (!strcmp(what, "init-sweep")) {
    /* The Nth mapping of the process fails (initialisation included), then every one after N. */
    for (unsigned n = 1; n <= 12; n++) {
      snprintf(spec, sizeof spec, "nth=%u", n);
      spawn_recover(spec);
    }
    for (unsigned n = 0; n <= 12; n += 3) {
      snprintf(spec, sizeof spec, "after=%u", n);
      spawn_recover(spec);
    }
  } else {
    fprintf(stderr, "usage: test_faults init | init-sweep | nth | after | random [SEED]\n");
    return 2;
  }
  if (strcmp(what, "init-sweep"))
    CHECK(total_failed > 0, "%s: the shim made no call fail: the scenario tested nothing", what);
  if (strcmp(what, "init-sweep")) printf("%lu calls made to fail\n", total_failed);
  check_no_leak(base, what);
  return mt_result("test_faults");
}
