/* test_memory_paths.c — memory goes back on the paths that used to keep it (item 7): (a) pages of an exited thread
 * emptied by remote frees, (b) the huge cache without the purging thread, (c) heaps of threads that allocate in
 * their TLS destructors. The case is the first argument; ctest runs each with its own MALLARD_CONF. */
#include "mtest.h"
#include <pthread.h>

static long rss_kb(void) { return mt_status_kb("VmRSS:"); }

/* (a) A thread allocates 64 MiB of small blocks and exits (its pages are abandoned, none empty); main frees them
 * all. After the decay delay (200 ms here) the memory is back, with no forced trim. */
enum { ABANDON_N = 1 << 20 };
static void **handed;
static void *producer(void *arg) {
  (void)arg;
  for (size_t i = 0; i < ABANDON_N; i++) {
    handed[i] = M_malloc(64);
    REQUIRE(handed[i], "malloc(64)");
    memset(handed[i], (int)(i & 0xff), 64);
  }
  return NULL;
}
static void case_abandoned(void) {
  long start = rss_kb();
  handed = M_malloc(ABANDON_N * sizeof(void *));
  REQUIRE(handed, "malloc(handed)");
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, producer, NULL) == 0, "pthread_create");
  pthread_join(t, NULL);
  long peak = rss_kb();
  for (size_t i = 0; i < ABANDON_N; i++) M_free(handed[i]);
  M_free(handed);
  usleep(1500 * 1000);
  long end = rss_kb();
  printf("abandoned pages: VmRSS start %ld KiB, peak %ld KiB, 1.5 s after the frees %ld KiB\n", start, peak, end);
  CHECK(peak > start + 50 * 1024, "the workload did not take memory (peak %ld, start %ld)", peak, start);
  CHECK(end < start + 12 * 1024, "%ld KiB still resident 1.5 s after every block came back (start %ld KiB)", end, start);
}

/* (b) background_thread:false: freed huge blocks wait in the huge cache; later allocator activity after the
 * decay delay unmaps them (there is no thread to do it while the program is idle). */
static void case_huge_cache(void) {
  long start = rss_kb();
  void *b[25];
  for (int i = 0; i < 25; i++) {
    b[i] = M_malloc(8u << 20);
    REQUIRE(b[i], "malloc(8 MiB)");
    memset(b[i], 1, 8u << 20);
  }
  long peak = rss_kb();
  for (int i = 0; i < 25; i++) M_free(b[i]);
  usleep(500 * 1000);   /* past the decay delay of 200 ms */
  for (int i = 0; i < 10; i++) {   /* ordinary activity: small, medium and large blocks */
    void *p = M_malloc((size_t)100 << (i % 12));
    M_free(p);
  }
  long end = rss_kb();
  printf("huge cache without the thread: VmRSS start %ld KiB, peak %ld KiB, after activity %ld KiB\n", start, peak, end);
  CHECK(peak > start + 150 * 1024, "the workload did not take memory");
  CHECK(end < start + 12 * 1024, "%ld KiB still resident after the decay delay and activity (start %ld KiB)", end, start);
}

/* (c) A TLS destructor that allocates and sets its key again, every round glibc runs: the thread must not leave
 * a heap behind (it used to make a new heap in each round, and the last one was never abandoned). */
static pthread_key_t key;
static void dtor(void *v) {
  M_free(v);
  void *p = M_malloc(100);   /* after Mallard's own destructor in this round, or in a later round */
  REQUIRE(p, "malloc in a TLS destructor");
  memset(p, 7, 100);
  pthread_setspecific(key, p);   /* asks for another round; in the last one, p is left (the program's leak) */
}
static void *tls_thread(void *arg) {
  (void)arg;
  void *p = M_malloc(100);
  pthread_setspecific(key, p);
  return NULL;
}
static unsigned live_heaps(void) {
  unsigned n = 0, total = 0;
  size_t len = sizeof n;
  REQUIRE(MT_CTL("arenas.narenas", &n, &len, NULL, 0) == 0, "mallard_ctl(arenas.narenas)");
  for (unsigned i = 0; i < n; i++) {
    char name[64];
    unsigned t = 0;
    len = sizeof t;
    snprintf(name, sizeof name, "stats.arenas.%u.nthreads", i);
    int r = MT_CTL(name, &t, &len, NULL, 0);
    CHECK(r == 0, "mallard_ctl(%s) = %d", name, r);
    total += t;
  }
  return total;
}
static void case_tls(void) {
  REQUIRE(pthread_key_create(&key, dtor) == 0, "pthread_key_create");
  void *warm = M_malloc(10);   /* main's own heap */
  unsigned before = live_heaps();
  for (int i = 0; i < 200; i++) {
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, tls_thread, NULL) == 0, "pthread_create");
    pthread_join(t, NULL);
  }
  unsigned after = live_heaps();
  printf("TLS destructors: %u heap(s) attached before 200 threads, %u after\n", before, after);
  CHECK(after == before, "%u heaps left behind by 200 exited threads", after - before);
  M_free(warm);
}

int main(int argc, char **argv) {
  const char *c = argc > 1 ? argv[1] : "";
  if (!strcmp(c, "abandoned")) case_abandoned();
  else if (!strcmp(c, "huge_cache")) case_huge_cache();
  else if (!strcmp(c, "tls")) case_tls();
  else REQUIRE(0, "usage: %s abandoned|huge_cache|tls", argv[0]);
  return mt_result("test_memory_paths[" MT_MODE "]");
}
