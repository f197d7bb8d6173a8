/* test_purge_wakeup.c — the purging thread never misses a notification: memory freed while it is about to go idle
 * (or idle) is purged within the decay delay, round after round (item 7's wake-up protocol; the race-delay build
 * pauses the thread between reading the pending flag and looking for dirty memory). */
#include "mtest.h"

static uint64_t stat_u64(const char *name) {
  size_t v = 0, len = sizeof v;
  int r = MT_CTL(name, &v, &len, NULL, 0);
  CHECK(r == 0, "mallard_ctl(%s) = %d", name, r);
  return v;
}

int main(void) {
  enum { N = 160 };
  void *b[N];
  int late = 0;
  for (int round = 0; round < 25; round++) {
    for (int i = 0; i < N; i++) {
      b[i] = M_malloc((size_t)(64 + (i % 4) * 32) << 10);   /* large spans, and every 8th round a huge block */
      REQUIRE(b[i], "malloc");
      memset(b[i], 1, 4096);
    }
    void *h = round % 8 == 0 ? M_malloc(6u << 20) : NULL;
    /* Free at varying moments relative to the thread's last wake-up. */
    usleep((useconds_t)(round * 7 % 60) * 1000);
    for (int i = 0; i < N; i++) M_free(b[i]);
    M_free(h);
    double t0 = mt_now();
    uint64_t dirty = stat_u64("stats.dirty");
    while (dirty && mt_now() - t0 < 1.0) {   /* decay is 50 ms: purged well within a second */
      usleep(10 * 1000);
      dirty = stat_u64("stats.dirty");
    }
    if (dirty) late++;
    CHECK(dirty == 0, "round %d: %llu bytes still dirty 1 s after the frees (decay 50 ms)", round, (unsigned long long)dirty);
  }
  printf("rounds with memory left dirty: %d of 25\n", late);
  return mt_result("test_purge_wakeup[" MT_MODE "]");
}
