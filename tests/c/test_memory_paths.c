/* test_memory_paths.c — memory goes back to the system on each path of issue 8 item 7, measured from VmRSS:
 *   abandoned   pages of exited threads emptied by remote frees are returned without any forced trim;
 *   huge-bg     freed huge blocks (the huge cache) are returned by the purging thread;
 *   huge-nobg   the same with background_thread:false, once the program makes allocator calls again;
 *   tls-heaps   a thread whose TLS destructor allocates in every round leaves no heap behind.
 * The configuration (decay, background thread) comes from MALLARD_CONF in CMakeLists.txt. */
#include "mtest.h"
#include <limits.h>
#include <pthread.h>
#include <sys/mman.h>

#define KiB ((size_t)1024)
#define MiB ((size_t)1024 * 1024)

/* ---- abandoned: 4 threads fill 128 MiB with small blocks, hand them over and exit; main frees them all ---- */
enum { AB_THREADS = 4 };
#define AB_BYTES (32 * MiB)
static void **ab_blocks[AB_THREADS];
static size_t ab_count[AB_THREADS];

static void *ab_worker(void *arg) {
  uintptr_t id = (uintptr_t)arg;
  mt_rng_t r;
  mt_rng_seed(&r, id + 5);
  size_t total = 0, n = 0, cap = AB_BYTES / 64;
  /* The pointer array comes from mmap: only the blocks themselves are Mallard's. */
  void **b = mmap(NULL, cap * sizeof(void *), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(b != MAP_FAILED, "mmap");
  while (total < AB_BYTES && n < cap) {
    size_t s = 64 + mt_rng_below(&r, 960);
    b[n] = M_malloc(s);
    REQUIRE(b[n], "malloc(%zu)", s);
    memset(b[n], 0x6B, s);
    total += s;
    n++;
  }
  ab_blocks[id] = b;
  ab_count[id] = n;
  return NULL;   /* exits with every block live: its heap is abandoned */
}

static void case_abandoned(void) {
  M_free(M_malloc(1));
  long rss0 = mt_status_kb("VmRSS:");
  pthread_t t[AB_THREADS];
  for (uintptr_t i = 0; i < AB_THREADS; i++) REQUIRE(!pthread_create(&t[i], NULL, ab_worker, (void *)i), "create");
  for (int i = 0; i < AB_THREADS; i++) pthread_join(t[i], NULL);
  long peak = mt_status_kb("VmRSS:");
  for (int i = 0; i < AB_THREADS; i++) {
    for (size_t k = 0; k < ab_count[i]; k++) M_free(ab_blocks[i][k]);   /* remote frees into abandoned pages */
    munmap(ab_blocks[i], AB_BYTES / 64 * sizeof(void *));
  }
  long limit = mt_rss_limit(rss0, 16 * 1024);
  long rss = mt_wait_rss(limit, 5.0);
  printf("abandoned: VmRSS start %ld KiB, peak %ld KiB, 5 s after the last free %ld KiB (limit %ld KiB)\n", rss0, peak,
         rss, limit);
  CHECK(peak > rss0 + 100 * 1024, "the blocks were not resident (peak %ld KiB)", peak);
  CHECK(rss <= limit, "pages emptied by remote frees stayed resident: %ld KiB > %ld KiB", rss, limit);
}

/* ---- huge cache: 200 MiB of huge blocks freed ---- */
static void case_huge(bool with_bg) {
  M_free(M_malloc(1));
  long rss0 = mt_status_kb("VmRSS:");
  enum { N = 40 };
  void *b[N];
  for (int i = 0; i < N; i++) {
    size_t s = 3 * MiB + (size_t)i * 64 * KiB;
    b[i] = M_malloc(s);
    REQUIRE(b[i], "malloc(%zu)", s);
    memset(b[i], 0x3A, s);
  }
  long peak = mt_status_kb("VmRSS:");
  for (int i = 0; i < N; i++) M_free(b[i]);
  long limit = mt_rss_limit(rss0, 16 * 1024);
  long rss;
  if (with_bg) {
    rss = mt_wait_rss(limit, 5.0);
  } else {
    /* No purging thread: after the decay delay, allocator calls on the slow paths must age the cache. */
    usleep(1200 * 1000);
    for (int i = 0; i < 50; i++) {
      void *p = M_malloc(300 * KiB);
      REQUIRE(p, "malloc(300K)");
      M_free(p);
      p = M_malloc(64 * KiB);
      M_free(p);
    }
    rss = mt_status_kb("VmRSS:");
  }
  printf("huge (%s): VmRSS start %ld KiB, peak %ld KiB, after %ld KiB (limit %ld KiB)\n",
         with_bg ? "purging thread" : "no purging thread", rss0, peak, rss, limit);
  CHECK(peak > rss0 + 150 * 1024, "the blocks were not resident (peak %ld KiB)", peak);
  CHECK(rss <= limit, "freed huge blocks stayed resident: %ld KiB > %ld KiB", rss, limit);
}

/* ---- tls-heaps: threads whose TLS destructor allocates in every round, the last one included ---- */
static pthread_key_t key;
static __thread unsigned rounds;
static void destructor(void *v) {
  M_free(v);
  rounds++;
  void *p = M_malloc(100);   /* in the last round this may create the thread's heap anew */
  REQUIRE(p, "malloc in a TLS destructor");
  if (rounds < PTHREAD_DESTRUCTOR_ITERATIONS) pthread_setspecific(key, p);
  else M_free(p);
}
static void *tls_thread(void *arg) {
  (void)arg;
  pthread_setspecific(key, M_malloc(100));
  return NULL;
}

static void case_tls_heaps(void) {
  REQUIRE(pthread_key_create(&key, destructor) == 0, "pthread_key_create");
  M_free(M_malloc(1));
  unsigned before = mt_live_heaps();
  for (int i = 0; i < 300; i++) {
    pthread_t t;
    REQUIRE(!pthread_create(&t, NULL, tls_thread, NULL), "create");
    pthread_join(t, NULL);
  }
  unsigned after = mt_live_heaps();
  printf("tls-heaps: heaps attached to arenas before %u, after 300 threads %u\n", before, after);
  CHECK(after <= before + 2, "threads allocating in their last TLS destructor round left %u heaps behind",
        after - before);
}

int main(int argc, char **argv) {
  const char *c = argc > 1 ? argv[1] : "";
  printf("test_memory_paths %s (%s build, MALLARD_CONF=%s)\n", c, MT_MODE,
         getenv("MALLARD_CONF") ? getenv("MALLARD_CONF") : "");
  if (!strcmp(c, "abandoned")) case_abandoned();
  else if (!strcmp(c, "huge-bg")) case_huge(true);
  else if (!strcmp(c, "huge-nobg")) case_huge(false);
  else if (!strcmp(c, "tls-heaps")) case_tls_heaps();
  else { fprintf(stderr, "usage: test_memory_paths abandoned | huge-bg | huge-nobg | tls-heaps\n"); return 2; }
  return mt_result("test_memory_paths");
}
