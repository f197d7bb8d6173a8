/* test_memory_return.c — ~200 MiB in many sizes, all freed: after the decay delay VmRSS is back near its start. */
#include "mtest.h"

#define MiB ((size_t)1024 * 1024)
#define TARGET (200 * MiB)
#define SLACK_KB (4 * 1024L)          /* "within 10% + a few MiB" of the starting RSS */
#define WAIT_S 5.0                    /* decay is 200 ms in the test's MALLARD_CONF; the purging thread needs a moment */

int main(void) {
  M_free(M_malloc(1));
  long rss0 = mt_status_kb("VmRSS:");
  REQUIRE(rss0 > 0, "cannot read VmRSS");
  size_t len = sizeof(long);
  long decay = -2;
  int rc = MT_CTL("opt.dirty_decay_ms", &decay, &len, NULL, 0);
  REQUIRE(rc == 0 && len == sizeof(long), "mallard_ctl(opt.dirty_decay_ms) = %d, len %zu", rc, len);
  printf("dirty_decay_ms %ld (MALLARD_CONF=%s)\n", decay, getenv("MALLARD_CONF") ? getenv("MALLARD_CONF") : "");

  /* Size mix by bytes: a quarter each in small, medium, large and huge blocks. */
  enum { MAXB = 400000 };
  void **b = M_malloc(MAXB * sizeof(void *));
  REQUIRE(b, "malloc");
  mt_rng_t r;
  mt_rng_seed(&r, 42);
  size_t total = 0, n = 0, by_kind[4] = { 0 };
  while (total < TARGET && n < MAXB) {
    unsigned kind = (unsigned)mt_rng_below(&r, 4);
    size_t s = kind == 0 ? 1 + mt_rng_below(&r, 2048)
             : kind == 1 ? 8192 + mt_rng_below(&r, 248 * 1024)
             : kind == 2 ? 256 * 1024 + mt_rng_below(&r, 1792 * 1024)
                         : 2 * MiB + mt_rng_below(&r, 14 * MiB);
    if (by_kind[kind] > TARGET / 4) continue;
    b[n] = M_malloc(s);
    REQUIRE(b[n], "malloc(%zu)", s);
    memset(b[n], 0xA7, s);   /* touch every page: it is resident */
    total += s;
    by_kind[kind] += s;
    n++;
  }
  long rss_peak = mt_status_kb("VmRSS:");
  /* Free in an order unlike allocation: odd indexes first, then even ones. */
  for (size_t i = 1; i < n; i += 2) M_free(b[i]);
  for (size_t i = 0; i < n; i += 2) M_free(b[i]);
  M_free(b);
  long rss_freed = mt_status_kb("VmRSS:");
  long limit = rss0 + rss0 / 10 + SLACK_KB;
  double t0 = mt_now();
  long rss = rss_freed;
  /* Idle: the program makes no allocator call while it waits; the background thread must do the purging. */
  while (mt_now() - t0 < WAIT_S) {
    usleep(100 * 1000);
    rss = mt_status_kb("VmRSS:");
    if (rss <= limit && mt_now() - t0 > (double)(decay > 0 ? decay : 0) / 1000.0) break;
  }
  printf("%zu blocks, %zu MiB (small %zu, medium %zu, large %zu, huge %zu MiB)\n", n, total / MiB, by_kind[0] / MiB,
         by_kind[1] / MiB, by_kind[2] / MiB, by_kind[3] / MiB);
  printf("VmRSS: start %ld KiB, peak %ld KiB, right after free %ld KiB, after %.2f s idle %ld KiB (limit %ld KiB)\n",
         rss0, rss_peak, rss_freed, mt_now() - t0, rss, limit);
  CHECK(rss_peak > rss0 + (long)(TARGET / 1024) * 9 / 10, "the blocks were not resident (peak %ld KiB)", rss_peak);
  CHECK(rss <= limit, "VmRSS %ld KiB did not return within 10%% + %ld KiB of the start (%ld KiB) after %.1f s", rss,
        SLACK_KB, rss0, WAIT_S);
  /* The allocator is usable afterwards and memory comes back again on a second round. */
  void *p = M_malloc(50 * MiB);
  REQUIRE(p, "malloc(50M)");
  memset(p, 1, 50 * MiB);
  M_free(p);
  return mt_result("test_memory_return (" MT_MODE ")");
}
