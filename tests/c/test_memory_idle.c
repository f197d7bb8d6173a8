/* test_memory_idle.c — memory that waits on no thread's next allocation goes back (issue 14, memory defects 1-3):
 *   exit-heap    64 MiB allocated and freed inside a TLS destructor (after Mallard's own): back after the decay;
 *   late-heaps   2,000 threads whose first allocation is in the last TLS destructor round leave no heap behind;
 *   idle-owner   64 MiB of 1000-byte blocks of a live but idle producer, all freed by another thread: back
 *                after the decay delay with the purging thread; idle-owner-trim: at once by malloc_trim(0)
 *                without it.
 *   idle-unparked  the same, but the producer first frees one block of each of its pages itself (issue 36 bug 2):
 *                each page leaves the full list for the class list, where sweeps once never looked; back after
 *                the decay delay with the purging thread; idle-unparked-trim: at once by malloc_trim(0).
 * The configuration (decay, background thread) comes from MALLARD_CONF in CMakeLists.txt. */
#include "mtest.h"
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <sys/mman.h>

#define MiB ((size_t)1024 * 1024)
#define BLOCK 1000
#define NBLOCKS (64 * MiB / BLOCK)

/* The pointer arrays come from mmap: only the blocks themselves are Mallard's. */
static void **map_array(size_t n) {
  void **a = mmap(NULL, n * sizeof(void *), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(a != MAP_FAILED, "mmap");
  return a;
}

/* ---- exit-heap: a TLS destructor of the program allocates after Mallard's has run ---- */
static pthread_key_t xkey;
static void exit_destructor(void *v) {
  if (v == (void *)1) {                     /* round 1: Mallard's destructor runs in this round too; go again */
    pthread_setspecific(xkey, (void *)2);
    return;
  }
  void **a = map_array(NBLOCKS);
  for (size_t i = 0; i < NBLOCKS; i++) {
    a[i] = M_malloc(BLOCK);
    REQUIRE(a[i], "malloc in a TLS destructor");
    memset(a[i], 0x5A, BLOCK);
  }
  for (size_t i = 0; i < NBLOCKS; i++) M_free(a[i]);
  munmap(a, NBLOCKS * sizeof(void *));
}
static void *exit_thread(void *arg) {
  (void)arg;
  M_free(M_malloc(64));                     /* the thread has a heap: Mallard's destructor runs at its exit */
  pthread_setspecific(xkey, (void *)1);
  return NULL;
}

static void case_exit_heap(void) {
  REQUIRE(pthread_key_create(&xkey, exit_destructor) == 0, "pthread_key_create");
  M_free(M_malloc(1));
  long rss0 = mt_status_kb("VmRSS:");
  pthread_t t;
  REQUIRE(!pthread_create(&t, NULL, exit_thread, NULL), "create");
  pthread_join(t, NULL);
  long limit = mt_rss_limit(rss0, 4 * 1024);
  long rss = mt_wait_rss(limit, 5.0);   /* idle: the purging thread must do it */
  printf("exit-heap: VmRSS start %ld KiB, 5 s after the destructor freed 64 MiB %ld KiB (limit %ld KiB)\n", rss0, rss,
         limit);
  CHECK(rss <= limit, "the exit heap kept its pages: %ld KiB > %ld KiB", rss, limit);
}

/* ---- late-heaps: the first allocation of a thread is in the last destructor round ---- */
static pthread_key_t lkey;
static void late_destructor(void *v) {
  uintptr_t round = (uintptr_t)v;
  if (round < PTHREAD_DESTRUCTOR_ITERATIONS) {   /* no allocation before the last round */
    pthread_setspecific(lkey, (void *)(round + 1));
    return;
  }
  void *p = M_malloc(100);                  /* the thread's first allocation: it makes the thread's heap */
  REQUIRE(p, "malloc in the last destructor round");
  M_free(p);
}
static void *late_thread(void *arg) {
  (void)arg;
  pthread_setspecific(lkey, (void *)1);     /* key index < 32: glibc stores it without allocating */
  return NULL;
}

static void case_late_heaps(void) {
  REQUIRE(pthread_key_create(&lkey, late_destructor) == 0, "pthread_key_create");
  M_free(M_malloc(1));
  unsigned before = mt_live_heaps();
  long rss0 = mt_status_kb("VmRSS:");
  for (int i = 0; i < 2000; i++) {
    pthread_t t;
    REQUIRE(!pthread_create(&t, NULL, late_thread, NULL), "create");
    pthread_join(t, NULL);
  }
  M_free(M_malloc(1));
  unsigned after = mt_live_heaps();
  long rss = mt_status_kb("VmRSS:");
  printf("late-heaps: heaps attached before %u, after 2000 threads %u; VmRSS %ld -> %ld KiB\n", before, after, rss0,
         rss);
  CHECK(after <= before + 2, "threads whose first allocation was in the last destructor round left %u heaps behind",
        after - before);
}

/* ---- idle-owner: a producer fills 64 MiB and sleeps; another thread frees every block ---- */
static void **io_blocks;
static pthread_mutex_t io_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t io_cond = PTHREAD_COND_INITIALIZER;
static int io_state;                        /* 1: blocks ready; 2: the producer may exit */
static bool io_unpark;                      /* the producer frees one block of each of its pages (NULL in io_blocks) */

static void *io_producer(void *arg) {
  (void)arg;
  for (size_t i = 0; i < NBLOCKS; i++) {
    io_blocks[i] = M_malloc(BLOCK);
    REQUIRE(io_blocks[i], "malloc");
    memset(io_blocks[i], 0x3C, BLOCK);
  }
  /* One owner free into each 64 KiB of blocks: every page filled so far is parked, and such a free puts it back
   * on its class list, with its other blocks still in use. */
  for (uintptr_t i = 0, last = 0; io_unpark && i < NBLOCKS; i++) {
    uintptr_t region = (uintptr_t)io_blocks[i] >> 16;
    if (region == last) continue;
    last = region;
    M_free(io_blocks[i]);
    io_blocks[i] = NULL;
  }
  pthread_mutex_lock(&io_lock);
  io_state = 1;
  pthread_cond_broadcast(&io_cond);
  while (io_state != 2) pthread_cond_wait(&io_cond, &io_lock);   /* alive and idle: no allocator call */
  pthread_mutex_unlock(&io_lock);
  return NULL;
}

static void case_idle_owner(bool trim) {
  M_free(M_malloc(1));
  long rss0 = mt_status_kb("VmRSS:");
  io_blocks = map_array(NBLOCKS);
  pthread_t t;
  REQUIRE(!pthread_create(&t, NULL, io_producer, NULL), "create");
  pthread_mutex_lock(&io_lock);
  while (io_state != 1) pthread_cond_wait(&io_cond, &io_lock);
  pthread_mutex_unlock(&io_lock);
  long peak = mt_status_kb("VmRSS:");
  for (size_t i = 0; i < NBLOCKS; i++) M_free(io_blocks[i]);   /* every free is a remote free (or of NULL) */
  long limit = mt_rss_limit(rss0, 4 * 1024);
  long rss;
  int trimmed = -1;
  if (trim) {
    trimmed = malloc_trim(0);
    rss = mt_status_kb("VmRSS:");
  } else {
    rss = mt_wait_rss(limit, 5.0);
  }
  printf("idle-%s%s: VmRSS start %ld KiB, peak %ld KiB, %s %ld KiB (limit %ld KiB)\n", io_unpark ? "unparked" : "owner",
         trim ? "-trim" : "", rss0,
         peak, trim ? "right after malloc_trim(0)" : "within 5 s of the last free", rss, limit);
  CHECK(peak > rss0 + 50 * 1024, "the blocks were not resident (peak %ld KiB)", peak);
  CHECK(rss <= limit, "blocks freed into an idle owner's pages stayed resident: %ld KiB > %ld KiB", rss, limit);
  if (trim) CHECK(trimmed == 1, "malloc_trim(0) returned %d although memory went back", trimmed);
  pthread_mutex_lock(&io_lock);
  io_state = 2;
  pthread_cond_broadcast(&io_cond);
  pthread_mutex_unlock(&io_lock);
  pthread_join(t, NULL);
  munmap(io_blocks, NBLOCKS * sizeof(void *));
}

int main(int argc, char **argv) {
  const char *c = argc > 1 ? argv[1] : "";
  printf("test_memory_idle %s (%s build, MALLARD_CONF=%s)\n", c, MT_MODE,
         getenv("MALLARD_CONF") ? getenv("MALLARD_CONF") : "");
  if (!strcmp(c, "exit-heap")) case_exit_heap();
  else if (!strcmp(c, "late-heaps")) case_late_heaps();
  else if (!strcmp(c, "idle-owner")) case_idle_owner(false);
  else if (!strcmp(c, "idle-owner-trim")) case_idle_owner(true);
  else if (!strcmp(c, "idle-unparked")) { io_unpark = true; case_idle_owner(false); }
  else if (!strcmp(c, "idle-unparked-trim")) { io_unpark = true; case_idle_owner(true); }
  else {
    fprintf(stderr, "usage: test_memory_idle exit-heap | late-heaps | idle-owner[-trim] | idle-unparked[-trim]\n");
    return 2;
  }
  return mt_result("test_memory_idle");
}
