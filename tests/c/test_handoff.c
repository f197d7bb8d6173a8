/* test_handoff.c — blocks and pages changing hands between threads: heaps abandoned by exiting threads while other
 * threads still free into them (remote frees into abandoned pages) and new threads adopt them, mallard_collect from
 * other threads during all of it, and the huge cache shared by many threads. Built for ThreadSanitizer too. */
#include "mtest.h"
#include <pthread.h>

#define KiB ((size_t)1024)
#define MiB ((size_t)1024 * 1024)
enum { ROUNDS = 6, WORKERS = 4, PER_WORKER = 3000, HUGE_THREADS = 4, HUGE_OPS = 60 };

typedef struct { uint8_t *p; size_t n; uint64_t tag; } blk_t;

/* A shared pool: exiting workers leave their blocks here; the freer threads take and free them later. */
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static blk_t *pool;
static size_t pool_len, pool_cap;
static _Atomic(int) stop_collect;
static _Atomic(uint64_t) freed_blocks, made_blocks;

static void pool_put(blk_t b) {
  pthread_mutex_lock(&pool_lock);
  if (pool_len < pool_cap) pool[pool_len++] = b;
  else { CHECK(0, "pool full"); }
  pthread_mutex_unlock(&pool_lock);
}
static bool pool_take(blk_t *b) {
  pthread_mutex_lock(&pool_lock);
  bool ok = pool_len > 0;
  if (ok) *b = pool[--pool_len];
  pthread_mutex_unlock(&pool_lock);
  return ok;
}

static void check_and_free(blk_t b) {
  size_t bad = mt_verify(b.p, b.n, b.tag);
  CHECK(bad == b.n, "block %p (%zu bytes, tag %llu) damaged at %zu", (void *)b.p, b.n, (unsigned long long)b.tag, bad);
  M_free(b.p);
  atomic_fetch_add(&freed_blocks, 1);
}

/* Allocates, frees half of it itself, leaves the rest in the pool and exits: its heap is abandoned with live
 * blocks in its pages. */
static void *worker(void *arg) {
  uint64_t id = (uint64_t)(uintptr_t)arg;
  mt_rng_t r;
  mt_rng_seed(&r, id * 7919 + 1);
  blk_t mine[PER_WORKER];
  for (int i = 0; i < PER_WORKER; i++) {
    size_t n = mt_rng_below(&r, 8) == 0 ? 8 * KiB + mt_rng_below(&r, 120 * KiB) : 8 + mt_rng_below(&r, 1000);
    uint8_t *p = M_malloc(n);
    REQUIRE(p, "malloc(%zu)", n);
    uint64_t tag = id * 100000 + (uint64_t)i;
    mt_fill(p, n, tag);
    mine[i] = (blk_t){ p, n, tag };
    atomic_fetch_add(&made_blocks, 1);
  }
  for (int i = 0; i < PER_WORKER; i++) {
    if (i % 2) pool_put(mine[i]);
    else check_and_free(mine[i]);
  }
  return NULL;
}

/* Frees what exited workers left (remote frees into abandoned pages). */
static void *freer(void *arg) {
  (void)arg;
  blk_t b;
  while (pool_take(&b)) check_and_free(b);
  return NULL;
}

/* mallard_collect from a thread that allocates nothing else, over and over, while the others run. */
static void *collector(void *arg) {
  (void)arg;
  unsigned n = 0;
  while (!atomic_load(&stop_collect)) {
    MT_COLLECT(n++ % 4 == 0);
    usleep(200);
  }
  return NULL;
}

/* Huge blocks from many threads at once: allocated, grown and shrunk with realloc, freed (through the huge cache). */
static void *huge_user(void *arg) {
  uint64_t id = (uint64_t)(uintptr_t)arg;
  mt_rng_t r;
  mt_rng_seed(&r, id + 99);
  for (int i = 0; i < HUGE_OPS; i++) {
    size_t n = 3 * MiB + mt_rng_below(&r, 10 * MiB);
    uint8_t *p = M_malloc(n);
    REQUIRE(p, "malloc(%zu)", n);
    p[0] = (uint8_t)id;
    p[n - 1] = (uint8_t)i;
    size_t m = 3 * MiB + mt_rng_below(&r, 14 * MiB);
    uint8_t *q = M_realloc(p, m);
    REQUIRE(q, "realloc(%zu -> %zu)", n, m);
    CHECK(q[0] == (uint8_t)id && (m < n || q[n - 1] == (uint8_t)i), "huge realloc lost contents");
    if (mt_rng_below(&r, 3) == 0) {
      uint8_t *a = M_aligned_alloc(4 * MiB, 5 * MiB);
      REQUIRE(a, "aligned_alloc(4M, 5M)");
      CHECK(((uintptr_t)a & (4 * MiB - 1)) == 0, "aligned huge block %p", (void *)a);
      a[5 * MiB - 1] = 1;
      M_free(a);
    }
    M_free(q);
  }
  return NULL;
}

int main(void) {
  pool_cap = (size_t)ROUNDS * WORKERS * PER_WORKER;
  pool = M_malloc(pool_cap * sizeof *pool);
  REQUIRE(pool, "malloc(pool)");
  size_t alloc0 = 0, len = sizeof alloc0;
  REQUIRE(MT_CTL("stats.allocated", &alloc0, &len, NULL, 0) == 0 && len == sizeof alloc0, "stats.allocated");
  pthread_t col, hug[HUGE_THREADS];
  REQUIRE(!pthread_create(&col, NULL, collector, NULL), "create");
  for (uintptr_t i = 0; i < HUGE_THREADS; i++) REQUIRE(!pthread_create(&hug[i], NULL, huge_user, (void *)i), "create");
  for (int round = 0; round < ROUNDS; round++) {
    pthread_t w[WORKERS], f[2];
    for (uintptr_t i = 0; i < WORKERS; i++)
      REQUIRE(!pthread_create(&w[i], NULL, worker, (void *)(uintptr_t)(round * WORKERS + (int)i + 1)), "create");
    /* Freers run while workers are still allocating or exiting: frees race with abandonment and adoption. */
    for (int i = 0; i < 2; i++) REQUIRE(!pthread_create(&f[i], NULL, freer, NULL), "create");
    for (int i = 0; i < WORKERS; i++) pthread_join(w[i], NULL);
    for (int i = 0; i < 2; i++) pthread_join(f[i], NULL);
  }
  blk_t b;
  while (pool_take(&b)) check_and_free(b);
  for (int i = 0; i < HUGE_THREADS; i++) pthread_join(hug[i], NULL);
  atomic_store(&stop_collect, 1);
  pthread_join(col, NULL);
  CHECK(atomic_load(&freed_blocks) == atomic_load(&made_blocks), "freed %llu of %llu blocks",
        (unsigned long long)atomic_load(&freed_blocks), (unsigned long long)atomic_load(&made_blocks));
  M_free(pool);
  size_t alloc1 = 0;
  len = sizeof alloc1;
  REQUIRE(MT_CTL("stats.allocated", &alloc1, &len, NULL, 0) == 0 && len == sizeof alloc1, "stats.allocated");
  CHECK(alloc1 <= alloc0 + 256 * KiB, "stats.allocated %zu -> %zu after everything was freed", alloc0, alloc1);
  return mt_result("test_handoff (" MT_MODE ")");
}
