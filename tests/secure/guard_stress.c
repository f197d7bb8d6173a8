/* guard_stress.c — sampled guarded allocations under threads: blocks (many guarded, at a high rate and with few slots
 * so that slots are reused all the time) are handed between threads through a shared table and checked and freed
 * by whichever thread takes them (cross-thread frees), some grown by realloc; a fork in the middle must allocate in
 * the child (not under ThreadSanitizer). Prefixed API (mallard-prefix / mallard-secure-prefix); run under ThreadSanitizer by the tsan build. */
#include "mtest.h"
#include <pthread.h>
#include <sys/wait.h>

/* Nearly one allocation in eight guarded, 16 slots: the pool is full and recycled constantly. */
const char *mallard_conf = "guard_sample:512,guard_slots:16";

#define NTHREADS 4
#define ITERS 20000
#define TABLE 64
static _Atomic(void *) table[TABLE];

typedef struct { uint64_t size, tag; } hdr_t;   /* a block's first bytes; the rest holds the tag's byte */

static void *make(mt_rng_t *rng) {
  size_t size = 16 + mt_rng_next(rng) % 5000;   /* about four in five fit a guarded slot (<= 4096 bytes) */
  uint8_t *p = M_calloc(1, size);
  REQUIRE(p, "calloc(%zu) failed", size);
  for (size_t i = sizeof(hdr_t); i < size; i++) CHECK(!p[i], "calloc'd byte %zu of %zu not zero", i, size);
  hdr_t h = { size, mt_rng_next(rng) };
  memcpy(p, &h, sizeof h);
  memset(p + sizeof h, (int)(h.tag & 0xff), size - sizeof h);
  return p;
}

static void check_and_free(uint8_t *p) {
  hdr_t h;
  memcpy(&h, p, sizeof h);
  CHECK(h.size >= 16 && h.size < 16 + 5000 * 2, "bad header size %llu", (unsigned long long)h.size);
  CHECK(M_usable(p) >= h.size, "usable %zu < %llu", M_usable(p), (unsigned long long)h.size);
  for (size_t i = sizeof h; i < h.size; i++)
    if (p[i] != (uint8_t)(h.tag & 0xff)) { CHECK(0, "byte %zu of a %llu-byte block changed", i, (unsigned long long)h.size); break; }
  M_free(p);
}

static void *grow(uint8_t *p) {
  hdr_t h;
  memcpy(&h, p, sizeof h);
  size_t to = h.size + 100;
  uint8_t *q = M_realloc(p, to);
  REQUIRE(q, "realloc failed");
  memset(q + h.size, (int)(h.tag & 0xff), to - h.size);
  h.size = to;
  memcpy(q, &h, sizeof h);
  return q;
}

static void *worker(void *arg) {
  mt_rng_t rng;
  mt_rng_seed(&rng, (uintptr_t)arg);
  for (int i = 0; i < ITERS; i++) {
    void *p = make(&rng);
    if (mt_rng_next(&rng) % 4 == 0) p = grow(p);
    void *old = atomic_exchange(&table[mt_rng_next(&rng) % TABLE], p);   /* another thread's block, usually */
    if (old) check_and_free(old);
  }
  return NULL;
}

/* A fork while the others run: the child allocates (guarded too) and frees. */
static void *forker(void *arg) {
  (void)arg;
  for (int k = 0; k < 3; k++) {
    pid_t pid = fork();
    REQUIRE(pid >= 0, "fork failed");
    if (pid == 0) {
      mt_rng_t rng;
      mt_rng_seed(&rng, 7);
      for (int i = 0; i < 2000; i++) check_and_free(make(&rng));
      _exit(atomic_load(&mt_failures) ? 1 : 0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %d", st);
  }
  return NULL;
}

int main(void) {
  pthread_t t[NTHREADS], f;
  for (uintptr_t i = 0; i < NTHREADS; i++) pthread_create(&t[i], NULL, worker, (void *)(i + 1));
  /* ThreadSanitizer does not support fork in a multi-threaded process: guard_sample_tsan.sh sets GUARD_STRESS_NO_FORK */
  bool forking = !getenv("GUARD_STRESS_NO_FORK");
  if (forking) pthread_create(&f, NULL, forker, NULL);
  for (int i = 0; i < NTHREADS; i++) pthread_join(t[i], NULL);
  if (forking) pthread_join(f, NULL);
  for (int i = 0; i < TABLE; i++) {
    void *p = atomic_exchange(&table[i], NULL);
    if (p) check_and_free(p);
  }
  uint64_t samples = 0, live = 1, reports = 1;
  size_t len = sizeof samples;
  CHECK(MT_CTL("stats.guard.samples", &samples, &len, NULL, 0) == 0, "stats.guard.samples");
  CHECK(MT_CTL("stats.guard.live", &live, &len, NULL, 0) == 0, "stats.guard.live");
  CHECK(MT_CTL("stats.guard.reports", &reports, &len, NULL, 0) == 0, "stats.guard.reports");
  CHECK(samples > 1000, "only %llu guarded samples", (unsigned long long)samples);
  CHECK(live == 0, "%llu guarded blocks still counted live", (unsigned long long)live);
  CHECK(reports == 0, "%llu reports", (unsigned long long)reports);
  printf("guarded samples %llu\n", (unsigned long long)samples);
  return mt_result("guard_stress");
}
