/* test_owner_sweep.c — live owners, remote freers and sweeps at once: owners allocate and free into their parked
 * pages while other threads free the owners' blocks (batched remote frees) and a third party forces sweeps
 * (mallard_collect(true)) that give parked pages back. Every block carries a pattern checked before it is freed,
 * so a block handed out twice, or a page given back while a block of it is live, shows as damage. Built for
 * ThreadSanitizer and the race-delay build too. */
#include "mtest.h"
#include <pthread.h>

enum { OWNERS = 2, FREERS = 2, ROUNDS = 150, PER_ROUND = 4000, RING = 1 << 14 };

typedef struct { uint8_t *p; size_t n; uint64_t tag; } blk_t;

/* Owner i hands blocks to freer i through a bounded ring under a lock (the test's own synchronisation). */
typedef struct {
  pthread_mutex_t lock;
  blk_t ring[RING];
  size_t head, tail;
  bool done;
} chan_t;
static chan_t chans[OWNERS];
static _Atomic(int) owners_left = OWNERS;
static _Atomic(uint64_t) checked;

static void check_and_free(blk_t b) {
  size_t bad = mt_verify(b.p, b.n, b.tag);
  CHECK(bad == b.n, "block %p (%zu bytes, tag %llu) damaged at %zu", (void *)b.p, b.n, (unsigned long long)b.tag, bad);
  M_free(b.p);
  atomic_fetch_add_explicit(&checked, 1, memory_order_relaxed);
}

static bool chan_put(chan_t *c, blk_t b) {
  pthread_mutex_lock(&c->lock);
  bool ok = c->tail - c->head < RING;
  if (ok) c->ring[c->tail++ % RING] = b;
  pthread_mutex_unlock(&c->lock);
  return ok;
}

static void *owner(void *arg) {
  uintptr_t id = (uintptr_t)arg;
  mt_rng_t r;
  mt_rng_seed(&r, id * 31 + 7);
  static __thread blk_t mine[PER_ROUND];
  for (int round = 0; round < ROUNDS; round++) {
    for (int i = 0; i < PER_ROUND; i++) {
      size_t n = 16 + mt_rng_below(&r, mt_rng_below(&r, 4) ? 240 : 3000);
      uint8_t *p = M_malloc(n);
      REQUIRE(p, "malloc(%zu)", n);
      uint64_t tag = ((uint64_t)id << 40) | ((uint64_t)round << 20) | (uint64_t)i;
      mt_fill(p, n, tag);
      mine[i] = (blk_t){ p, n, tag };
    }
    /* Half to the freer (remote frees into pages that are by now parked), half freed here in random order
     * (owner frees into parked pages: the locked path). */
    for (int i = PER_ROUND - 1; i > 0; i--) {
      int j = (int)mt_rng_below(&r, (uint64_t)i + 1);
      blk_t t = mine[i]; mine[i] = mine[j]; mine[j] = t;
    }
    for (int i = 0; i < PER_ROUND; i++) {
      if (i % 2 == 0 && chan_put(&chans[id], mine[i])) continue;
      check_and_free(mine[i]);
    }
  }
  pthread_mutex_lock(&chans[id].lock);
  chans[id].done = true;
  pthread_mutex_unlock(&chans[id].lock);
  atomic_fetch_sub(&owners_left, 1);
  return NULL;
}

static void *freer(void *arg) {
  chan_t *c = &chans[(uintptr_t)arg];
  for (;;) {
    blk_t batch[256];
    size_t n = 0;
    pthread_mutex_lock(&c->lock);
    while (n < 256 && c->head < c->tail) batch[n++] = c->ring[c->head++ % RING];
    bool done = c->done && c->head == c->tail;
    pthread_mutex_unlock(&c->lock);
    for (size_t i = 0; i < n; i++) check_and_free(batch[i]);   /* this thread never allocates */
    if (done) return NULL;
    if (!n) sched_yield();
  }
}

static void *sweeper(void *arg) {
  (void)arg;
  while (atomic_load(&owners_left) > 0) {
    MT_COLLECT(true);   /* forced: every heap's parked pages whose blocks are all back go to their arena */
    sched_yield();
  }
  return NULL;
}

int main(void) {
  pthread_t o[OWNERS], f[FREERS], s;
  for (int i = 0; i < OWNERS; i++) pthread_mutex_init(&chans[i].lock, NULL);
  for (uintptr_t i = 0; i < OWNERS; i++) REQUIRE(!pthread_create(&o[i], NULL, owner, (void *)i), "create");
  for (uintptr_t i = 0; i < FREERS; i++) REQUIRE(!pthread_create(&f[i], NULL, freer, (void *)(i % OWNERS)), "create");
  REQUIRE(!pthread_create(&s, NULL, sweeper, NULL), "create");
  for (int i = 0; i < OWNERS; i++) pthread_join(o[i], NULL);
  for (int i = 0; i < FREERS; i++) pthread_join(f[i], NULL);
  pthread_join(s, NULL);
  printf("owner-sweep: %llu blocks checked and freed\n", (unsigned long long)atomic_load(&checked));
  CHECK(atomic_load(&checked) == (uint64_t)OWNERS * ROUNDS * PER_ROUND, "blocks lost: %llu checked",
        (unsigned long long)atomic_load(&checked));
  return mt_result("test_owner_sweep (" MT_MODE ")");
}
