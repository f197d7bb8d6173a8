/* test_churn.c — 10,000 short-lived threads allocate, free, and leave blocks for others: VmRSS must stay bounded. */
#include "mtest.h"
#include <pthread.h>

#define NTHREADS 10000
#define BATCH 16                      /* threads alive at once */
#define RSS_SLACK_KB (64 * 1024)      /* the bound: RSS at start + 64 MiB */
#define ORPHANS 512

/* Blocks left behind by exited threads, freed later by other threads (remote frees into abandoned pages). */
static pthread_mutex_t orphan_lock = PTHREAD_MUTEX_INITIALIZER;
static void *orphan[ORPHANS];
static uint64_t orphan_tag[ORPHANS];
static size_t orphan_size[ORPHANS];

static void *worker(void *arg) {
  uint64_t id = (uint64_t)(uintptr_t)arg;
  mt_rng_t r;
  mt_rng_seed(&r, id);
  enum { N = 40 };
  void *mine[N];
  size_t sz[N];
  for (int i = 0; i < N; i++) {
    uint64_t x = mt_rng_below(&r, 100);
    sz[i] = x < 80 ? 1 + mt_rng_below(&r, 512) : x < 97 ? 512 + mt_rng_below(&r, 16384) : 65536 + mt_rng_below(&r, 400000);
    mine[i] = M_malloc(sz[i]);
    REQUIRE(mine[i], "thread %llu: malloc(%zu)", (unsigned long long)id, sz[i]);
    mt_fill(mine[i], sz[i] < 256 ? sz[i] : 256, id * N + (uint64_t)i);
  }
  /* Free most; swap a few with the orphan table: free someone else's leftover, leave ours behind. */
  for (int i = 0; i < N; i++) {
    uint64_t tag = id * N + (uint64_t)i;
    size_t chk = sz[i] < 256 ? sz[i] : 256;
    CHECK(mt_verify(mine[i], chk, tag) == chk, "thread %llu: own block %d damaged", (unsigned long long)id, i);
    if (i % 8 == 0) {
      unsigned k = (unsigned)mt_rng_below(&r, ORPHANS);
      pthread_mutex_lock(&orphan_lock);
      void *old = orphan[k];
      uint64_t otag = orphan_tag[k];
      size_t osz = orphan_size[k];
      orphan[k] = mine[i];
      orphan_tag[k] = tag;
      orphan_size[k] = sz[i];
      pthread_mutex_unlock(&orphan_lock);
      if (old) {
        size_t oc = osz < 256 ? osz : 256;
        CHECK(mt_verify(old, oc, otag) == oc, "orphan block damaged");
        M_free(old);
      }
    } else {
      M_free(mine[i]);
    }
  }
  return NULL;
}

int main(void) {
  double t0 = mt_now();
  /* Warm up: the first threads create arenas and segments; the bound is about growth after that. */
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 * 1024);
  long rss0 = mt_status_kb("VmRSS:");
  long peak = rss0, vm0 = mt_status_kb("VmSize:"), vmpeak = vm0;
  REQUIRE(rss0 > 0, "cannot read VmRSS");
  pthread_t t[BATCH];
  for (int base = 0; base < NTHREADS; base += BATCH) {
    for (int i = 0; i < BATCH; i++)
      REQUIRE(!pthread_create(&t[i], &attr, worker, (void *)(uintptr_t)(base + i)), "pthread_create %d", base + i);
    for (int i = 0; i < BATCH; i++) pthread_join(t[i], NULL);
    if ((base / BATCH) % 25 == 0 || base + BATCH >= NTHREADS) {
      long rss = mt_status_kb("VmRSS:"), vm = mt_status_kb("VmSize:");
      if (rss > peak) peak = rss;
      if (vm > vmpeak) vmpeak = vm;
      CHECK(rss < rss0 + RSS_SLACK_KB, "after %d threads VmRSS %ld KiB >= start %ld KiB + 64 MiB", base + BATCH, rss, rss0);
      if (rss >= rss0 + RSS_SLACK_KB) break;
    }
  }
  for (int k = 0; k < ORPHANS; k++) M_free(orphan[k]);
  long rss_end = mt_status_kb("VmRSS:");
  printf("%d threads in %.2f s; VmRSS start %ld KiB, peak %ld KiB, end %ld KiB; VmSize start %ld KiB, peak %ld KiB\n",
         NTHREADS, mt_now() - t0, rss0, peak, rss_end, vm0, vmpeak);
  /* Address space must not grow without bound either (heaps, arenas, segments are reused). */
  CHECK(vmpeak < vm0 + 1024 * 1024, "VmSize grew by %ld KiB", vmpeak - vm0);
  return mt_result("test_churn (" MT_MODE ")");
}
