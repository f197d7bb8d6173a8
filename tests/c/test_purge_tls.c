/* test_purge_tls.c — with 60 KiB of static TLS (large C++ programs have that much), the purging thread still
 * starts and an idle program gives freed memory back (issue 14, memory defect 4). */
#include "mtest.h"

#define MiB ((size_t)1024 * 1024)

/* Static TLS of this size is carved out of every thread's stack, the purging thread's included. */
static __thread volatile char big_tls[60 * 1024];

int main(void) {
  big_tls[0] = 1;
  big_tls[sizeof big_tls - 1] = 1;
  M_free(M_malloc(1));
  long rss0 = mt_status_kb("VmRSS:");
  enum { N = 600 };
  void *b[N];
  for (int i = 0; i < N; i++) {   /* 100 KiB blocks, 60 MiB in all: medium pages from arena spans */
    b[i] = M_malloc(100 * 1024);
    REQUIRE(b[i], "malloc");
    memset(b[i], 0x11, 100 * 1024);
  }
  long peak = mt_status_kb("VmRSS:");
  for (int i = 0; i < N; i++) M_free(b[i]);
  M_free(M_malloc(64 * 1024));    /* an allocation slow path after the frees: where the purging thread starts */
  long limit = mt_rss_limit(rss0, 4 * 1024);
  long rss = mt_wait_rss(limit, 5.0);
  printf("purge-tls (%s): VmRSS start %ld KiB, peak %ld KiB, 5 s after freeing 60 MiB %ld KiB (limit %ld KiB)\n",
         MT_MODE, rss0, peak, rss, limit);
  CHECK(peak > rss0 + 50 * 1024, "the blocks were not resident (peak %ld KiB)", peak);
  CHECK(rss <= limit, "an idle program with 60 KiB of static TLS kept its freed memory: %ld KiB > %ld KiB", rss, limit);
  return mt_result("test_purge_tls");
}
