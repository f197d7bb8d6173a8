/* test_reclaim.c — pages that other threads emptied come back while their owner lives: a busy owner collects them
 * itself (its refills walk its pages when a sender asks, heap.c "reclaim"), an idle owner's are swept within tens of
 * milliseconds, not a decay period. Run as `busy` (MALLARD_CONF=background_thread:false: no sweep can do it) and as
 * `idle` (dirty_decay_ms:10000: a sweep at the decay delay would come 8.75 s late). Built for ThreadSanitizer too. */
#include "mtest.h"
#include <pthread.h>
#include <unistd.h>

enum { NBLOCKS = 10000, SIZE = 1000 };   /* ~10 MB in 64 KiB pages of 1 KiB blocks: over 150 pages */

static uint8_t *blocks[NBLOCKS];

static size_t ctl_size(const char *name) {
  size_t v = 0, len = sizeof v;
  REQUIRE(MT_CTL(name, &v, &len, NULL, 0) == 0 && len == sizeof v, "mallard_ctl(%s)", name);
  return v;
}
static size_t active(void) {
  uint64_t epoch = 1;
  size_t len = sizeof epoch;
  MT_CTL("epoch", &epoch, &len, &epoch, sizeof epoch);   /* refreshed statistics where the build caches them */
  return ctl_size("stats.active");
}

static void alloc_blocks(void) {
  for (int i = 0; i < NBLOCKS; i++) {
    blocks[i] = M_malloc(SIZE);
    REQUIRE(blocks[i], "malloc(%d)", SIZE);
    mt_fill(blocks[i], SIZE, (uint64_t)i);
  }
}

/* Another thread frees every block (remote frees, batched; its exit sends what it still holds). */
static void *free_blocks(void *arg) {
  (void)arg;
  for (int i = 0; i < NBLOCKS; i++) {
    size_t bad = mt_verify(blocks[i], SIZE, (uint64_t)i);
    CHECK(bad == SIZE, "block %d damaged at %zu", i, bad);
    M_free(blocks[i]);
  }
  return NULL;
}
static void free_elsewhere(void) {
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, free_blocks, NULL) == 0, "pthread_create");
  REQUIRE(pthread_join(t, NULL) == 0, "pthread_join");
}

/* The owner keeps allocating (other sizes: a refill of another class every round) and never collects on purpose;
 * with no purging thread nothing but its own refills can give the emptied pages back. */
static void case_busy(void) {
  size_t before = active();
  alloc_blocks();
  size_t full = active();
  free_elsewhere();
  enum { ROUND = 3000 };
  static void *tmp[ROUND];
  size_t now = full;
  double t0 = mt_now();
  while (mt_now() - t0 < 3) {
    for (int i = 0; i < ROUND; i++) REQUIRE((tmp[i] = M_malloc(48)) != NULL, "malloc(48)");
    for (int i = 0; i < ROUND; i++) M_free(tmp[i]);
    now = active();
    if (now <= before + 1024 * 1024) break;
  }
  printf("busy: stats.active %zu KiB before, %zu KiB with the blocks, %zu KiB %.3f s after another thread freed them\n",
         before / 1024, full / 1024, now / 1024, mt_now() - t0);
  CHECK(full >= before + 8 * 1024 * 1024, "the blocks did not take the memory expected: %zu KiB", (full - before) / 1024);
  CHECK(now <= before + 1024 * 1024, "a busy owner kept the pages others emptied: %zu KiB active, %zu KiB before",
        now / 1024, before / 1024);
}

/* The owner sleeps: the purging thread sweeps its parked pages once the sweep delay has passed. */
static void case_idle(void) {
  size_t before = active();
  alloc_blocks();
  size_t full = active();
  free_elsewhere();
  size_t now = full;
  double t0 = mt_now();
  while (mt_now() - t0 < 3) {
    usleep(10000);
    now = active();
    if (now <= before + 1024 * 1024) break;
  }
  double took = mt_now() - t0;
  printf("idle: stats.active %zu KiB before, %zu KiB with the blocks, %zu KiB %.3f s after another thread freed them\n",
         before / 1024, full / 1024, now / 1024, took);
  CHECK(full >= before + 8 * 1024 * 1024, "the blocks did not take the memory expected: %zu KiB", (full - before) / 1024);
  CHECK(now <= before + 1024 * 1024, "an idle owner's emptied pages stayed %.1f s: %zu KiB active, %zu KiB before", took,
        now / 1024, before / 1024);
}

int main(int argc, char **argv) {
  const char *c = argc > 1 ? argv[1] : "busy";
  if (!strcmp(c, "busy")) case_busy();
  else if (!strcmp(c, "idle")) case_idle();
  else REQUIRE(0, "unknown case %s (busy, idle)", c);
  return mt_result("reclaim");
}
