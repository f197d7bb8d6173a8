/* test_no_thread_in_free.c — free(), malloc_trim(), mallard_collect() and thread.tcache.flush never create a thread
 * (item 2: the purging thread was started from free; glibc frees TLS blocks under its stack-cache lock, which
 * pthread_create takes: a deadlock). The purging thread is still started, from an allocation.
 * Static link mode with `-Wl,--wrap=pthread_create`: libmallard.a's calls come here. */
#include "mtest.h"
#include <malloc.h>
#include <pthread.h>

int __real_pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *), void *arg);

static __thread volatile int in_release;   /* set while the test is inside a freeing call (volatile: kept around calls) */
static _Atomic(int) created_in_release;
static _Atomic(int) created;

int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *), void *arg) {
  if (in_release) atomic_fetch_add(&created_in_release, 1);
  atomic_fetch_add(&created, 1);
  return __real_pthread_create(t, a, fn, arg);
}

#define RELEASING(call) do { in_release = 1; call; in_release = 0; } while (0)

static bool purge_thread_running(void) {
  bool on = false;
  size_t len = sizeof on;
  int r = MT_CTL("background_thread", &on, &len, NULL, 0);
  CHECK(r == 0, "mallard_ctl(background_thread) = %d", r);
  return on;
}

int main(void) {
  enum { N = 4000 };
  static void *blocks[N];
  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < N; i++) {
      size_t n = (size_t)16 << (i % 14);   /* 16 B .. 128 KiB: small, medium and large blocks */
      blocks[i] = M_malloc(n);
      REQUIRE(blocks[i], "malloc(%zu)", n);
    }
    void *huge = M_malloc(12u << 20);
    REQUIRE(huge, "malloc(12 MiB)");
    for (int i = 0; i < N; i += 2) RELEASING(M_free(blocks[i]));
    RELEASING(M_free(huge));
    RELEASING(malloc_trim(0));
    for (int i = 1; i < N; i += 2) RELEASING(M_free(blocks[i]));
    RELEASING(MT_COLLECT(true));
    RELEASING(MT_CTL("thread.tcache.flush", NULL, NULL, NULL, 0));
  }
  CHECK(atomic_load(&created_in_release) == 0, "%d thread(s) created inside free/malloc_trim/collect",
        atomic_load(&created_in_release));
  /* Allocations do start it (the process mapped well over the threshold). */
  for (int i = 0; i < 100 && !purge_thread_running(); i++) {
    void *p = M_malloc(200000);
    M_free(p);
  }
  CHECK(purge_thread_running(), "the purging thread was never started (%d pthread_create calls)", atomic_load(&created));
  return mt_result("test_no_thread_in_free[static]");
}
