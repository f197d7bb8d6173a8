/* test_hand_over.c — parked pages of an idle live thread, freed into by others, are handed over to the heaps that need
 * pages (heap.c hand_over): `adopt` checks that it happens and that the blocks stay intact whoever frees them; `race`
 * has owners that go idle for a few ms and then free their own blocks into pages being handed over meanwhile, while
 * other threads free the owners' blocks and allocate (adopting those pages). Every block carries a pattern checked
 * before it is freed; `reap` checks that such pages come back once their last blocks have; `rounds` that every round
 * of an idle owner's blocks freed by another thread comes back, however the sends' sweep requests meet the sweeps
 * (a request lost there left the purging thread waiting for ever); `reap-wake` that a reap request alone wakes the
 * purging thread from a wait for a far deadline. The cases labelled mt are built for
 * ThreadSanitizer and the race-delay build too. */
#include "mtest.h"
#include <pthread.h>
#include <unistd.h>

static uint64_t handed(void) { return mt_ctl_u64("stats.pages_handed_over"); }

/* ---- adopt ---- */
enum { ABLOCKS = 20000, ASIZE = 64 };
static void *ablk[ABLOCKS];
static mt_stage_t astage = MT_STAGE_INIT;   /* 1: the owner's blocks are ready; 2: the owner may free the rest */

static void *adopt_owner(void *arg) {
  (void)arg;
  for (size_t i = 0; i < ABLOCKS; i++) {
    ablk[i] = M_malloc(ASIZE);
    REQUIRE(ablk[i], "malloc");
    mt_fill(ablk[i], ASIZE, i);
  }
  mt_stage_set(&astage, 1);
  mt_stage_wait(&astage, 2);   /* idle meanwhile: its parked pages may be handed over */
  for (size_t i = 1; i < ABLOCKS; i += 2) {   /* its own blocks, some now in pages of other heaps */
    size_t bad = mt_verify(ablk[i], ASIZE, i);
    CHECK(bad == ASIZE, "owner's block %zu damaged at %zu", i, bad);
    M_free(mt_hide(ablk[i]));
  }
  return NULL;
}

static bool in_owner_pages(const void *p) {
  uintptr_t page = (uintptr_t)p >> 16;   /* small pages are one 64 KiB slot */
  for (size_t i = 0; i < ABLOCKS; i += 64)
    if (((uintptr_t)ablk[i] >> 16) == page) return true;
  return false;
}

static int run_adopt(void) {
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, adopt_owner, NULL) == 0, "pthread_create");
  mt_stage_wait(&astage, 1);
  uint64_t before = handed();
  for (size_t i = 0; i < ABLOCKS; i += 2) {   /* half of each page comes back, as remote frees */
    size_t bad = mt_verify(ablk[i], ASIZE, i);
    CHECK(bad == ASIZE, "block %zu damaged at %zu", i, bad);
    M_free(mt_hide(ablk[i]));
  }
  /* The sends ask for a sweep within a few ms (the purging thread); wait up to 2 s. */
  double end = mt_now() + 2.0;
  while (handed() == before && mt_now() < end) {
    void *p = M_malloc(4096);   /* a refill now and then flushes this thread's outbox */
    M_free(mt_hide(p));
    usleep(1000);
  }
  uint64_t got = handed() - before;
  CHECK(got > 0, "no page of the idle owner was handed over");
  /* Our new blocks of the class come from the handed-over pages before any fresh page. */
  enum { MINE = ABLOCKS / 2 };
  static void *mine[MINE];
  size_t adopted = 0;
  for (size_t i = 0; i < MINE; i++) {
    mine[i] = M_malloc(ASIZE);
    REQUIRE(mine[i], "malloc");
    mt_fill(mine[i], ASIZE, 1000000 + i);
    adopted += in_owner_pages(mine[i]);
  }
  CHECK(adopted > 0, "none of %d new blocks came from the %llu pages handed over", MINE, (unsigned long long)got);
  mt_stage_set(&astage, 2);   /* the owner frees its half (remote frees into our pages now) while we free ours */
  for (size_t i = 0; i < MINE; i++) {
    size_t bad = mt_verify(mine[i], ASIZE, 1000000 + i);
    CHECK(bad == ASIZE, "new block %zu damaged at %zu", i, bad);
    M_free(mt_hide(mine[i]));
  }
  pthread_join(t, NULL);
  printf("adopt: %llu pages handed over, %zu of %d new blocks in them\n", (unsigned long long)got, adopted, MINE);
  return mt_result("hand_over adopt");
}


/* ---- reap: pages handed over while blocks of them were still out come back as soon as those are freed ---- */
/* Poll stats.active every 2 ms for up to `secs` until it is at most `limit`; returns the last value read. */
static size_t active_at_most(size_t limit, double secs) {
  size_t active;
  for (double end = mt_now() + secs; (active = mt_ctl_size("stats.active")) > limit && mt_now() < end;) usleep(2000);
  return active;
}

static void *free_range(void *arg) {   /* frees ablk[start], [start + 2], ...; a thread running it sends its outbox at exit */
  for (size_t i = (uintptr_t)arg; i < ABLOCKS; i += 2) {
    size_t bad = mt_verify(ablk[i], ASIZE, i);
    CHECK(bad == ASIZE, "block %zu damaged at %zu", i, bad);
    M_free(mt_hide(ablk[i]));
  }
  return NULL;
}

static void *reap_owner(void *arg) {
  (void)arg;
  for (size_t i = 0; i < ABLOCKS; i++) {
    ablk[i] = M_malloc(ASIZE);
    REQUIRE(ablk[i], "malloc");
    mt_fill(ablk[i], ASIZE, i);
  }
  mt_stage_set(&astage, 1);
  mt_stage_wait(&astage, 2);   /* idle throughout: other threads free every block */
  return NULL;
}

static int run_reap(void) {
  size_t active0 = mt_ctl_size("stats.active");
  pthread_t o, f;
  REQUIRE(pthread_create(&o, NULL, reap_owner, NULL) == 0, "pthread_create");
  mt_stage_wait(&astage, 1);
  uint64_t before = handed();
  REQUIRE(pthread_create(&f, NULL, free_range, (void *)(uintptr_t)0) == 0, "pthread_create");
  pthread_join(f, NULL);
  double end = mt_now() + 2.0;
  while (handed() == before && mt_now() < end) {
    void *p = M_malloc(4096);   /* an allocation's slow path starts the purging thread, which sweeps */
    M_free(mt_hide(p));
    usleep(1000);
  }
  uint64_t got = handed() - before;
  REQUIRE(got > 0, "no page of the idle owner was handed over");
  REQUIRE(pthread_create(&f, NULL, free_range, (void *)(uintptr_t)1) == 0, "pthread_create");
  pthread_join(f, NULL);
  /* Every block is back: the handed-over pages go back to their arena within the sweep age of the reap request
   * (not the 10 s decay this test sets), the others by the owner's sweep. Allow 1 s and 1 MiB. */
  size_t active = active_at_most(active0 + (1 << 20), 1.0);
  CHECK(active <= active0 + (1 << 20), "%llu pages handed over, every block freed: %zu KiB active 1 s later, %zu KiB before",
        (unsigned long long)got, active >> 10, active0 >> 10);
  mt_stage_set(&astage, 2);
  pthread_join(o, NULL);
  printf("reap: %llu pages handed over; %zu KiB active after the frees, %zu KiB before\n", (unsigned long long)got,
         active >> 10, active0 >> 10);
  return mt_result("hand_over reap");
}

/* Past BG_START_BYTES mapped, the next slow path starts the purging thread, which sweeps and reaps (a small program
 * has none). */
static void start_purging_thread(void) {
  M_free(mt_hide(M_malloc(16 << 20)));
  M_free(mt_hide(M_malloc(4096)));
}

/* ---- reap-wake: a reap request alone wakes the purging thread from a wait with a far deadline ----
 * Run with dirty_decay_ms:10000. Every parked page of an idle owner is handed over after half its blocks come back;
 * the other half then goes into abandoned pages only (the owner's current page asks for nothing), so the only
 * requests are reaps, while the purging thread waits for dirty spans due 10 s later. */
static size_t hand_over_settled(uint64_t before) {   /* pages handed over once no more come for 200 ms */
  uint64_t last = handed();
  double end = mt_now() + 3.0, quiet = mt_now() + 0.2;
  while (mt_now() < end && (last == before || mt_now() < quiet)) {
    usleep(2000);
    uint64_t now = handed();
    if (now != last) { last = now; quiet = mt_now() + 0.2; }
  }
  return (size_t)(last - before);
}

static int run_reap_wake(void) {
  start_purging_thread();
  /* Dirty spans with a 10 s decay for it to wait for. */
  enum { DN = 8192 };
  static void *d[DN];
  for (size_t i = 0; i < DN; i++) REQUIRE((d[i] = M_malloc(256)) != NULL, "malloc");
  for (size_t i = 0; i < DN; i++) M_free(mt_hide(d[i]));
  mt_flush_outbox();
  REQUIRE(mt_ctl_size("stats.dirty") > 0, "no dirty span for the purging thread to wait for");
  size_t active0 = mt_ctl_size("stats.active");
  pthread_t o;
  REQUIRE(pthread_create(&o, NULL, reap_owner, NULL) == 0, "pthread_create");
  mt_stage_wait(&astage, 1);
  uint64_t before = handed();
  free_range((void *)(uintptr_t)0);   /* half of each page back: soon sweeps hand every parked page over */
  mt_flush_outbox();   /* our outbox */
  size_t got = hand_over_settled(before);
  REQUIRE(got > 0, "no page of the idle owner was handed over");
  usleep(100000);   /* the purging thread back in its wait for the dirty spans' deadline */
  free_range((void *)(uintptr_t)1);   /* into abandoned pages: reap requests, nothing else */
  mt_flush_outbox();
  /* A reap falls due at the sweep age (16 ms) after its request; allow 1 s, and the owner's current page. */
  double t0 = mt_now();
  size_t active = active_at_most(active0 + (256 << 10), 1.0);
  CHECK(active <= active0 + (256 << 10), "%zu pages handed over, every block freed: %zu KiB active 1 s later, %zu KiB "
        "before (a reap request did not wake the purging thread?)", got, active >> 10, active0 >> 10);
  printf("reap-wake: %zu pages handed over; %zu KiB active %.0f ms after the last frees, %zu KiB before\n", got,
         active >> 10, (mt_now() - t0) * 1e3, active0 >> 10);
  mt_stage_set(&astage, 2);
  pthread_join(o, NULL);
  return mt_result("hand_over reap-wake");
}

/* ---- rounds ---- */
/* One owner and one freer for every round, both alive throughout: no thread exits (an exit leaves an orphan, whose
 * sweeps would come whatever became of the requests), and between rounds every thread is idle. */
enum { RROUNDS = 40, RBLOCKS = 8192, RSIZE = 256 };   /* 2 MiB a round */
static void *rblk[RBLOCKS];
/* Round numbers under astage's mutex: the owner allocates round n once go_alloc >= n, the freer frees it once go_free >= n. */
static unsigned go_alloc, ready, go_free, freed;
static bool rquit;

static void rset(unsigned *var, unsigned v) {
  pthread_mutex_lock(&astage.mu);
  *var = v;
  pthread_cond_broadcast(&astage.cv);
  pthread_mutex_unlock(&astage.mu);
}
static bool rwait(const unsigned *var, unsigned v) {   /* until *var >= v; false: quit instead */
  pthread_mutex_lock(&astage.mu);
  while (*var < v && !rquit) pthread_cond_wait(&astage.cv, &astage.mu);
  bool ok = *var >= v;
  pthread_mutex_unlock(&astage.mu);
  return ok;
}

static void *rounds_owner(void *arg) {
  (void)arg;
  for (unsigned round = 1; rwait(&go_alloc, round); round++) {   /* idle in between */
    uint64_t tag = (uint64_t)round << 32;
    for (size_t i = 0; i < RBLOCKS; i++) {
      rblk[i] = M_malloc(RSIZE);
      REQUIRE(rblk[i], "malloc");
      mt_fill(rblk[i], RSIZE, tag + i);
    }
    rset(&ready, round);
  }
  return NULL;
}

static void *rounds_freer(void *arg) {
  (void)arg;
  for (unsigned round = 1; rwait(&go_free, round); round++) {
    uint64_t tag = (uint64_t)round << 32;
    for (size_t i = 0; i < RBLOCKS; i++) {
      size_t bad = mt_verify(rblk[i], RSIZE, tag + i);
      CHECK(bad == RSIZE, "block %zu damaged at %zu", i, bad);
      M_free(mt_hide(rblk[i]));
    }
    mt_flush_outbox();   /* its outbox too */
    rset(&freed, round);
  }
  return NULL;
}

static int run_rounds(void) {
  mt_rng_t r;
  mt_rng_seed(&r, 4242);
  start_purging_thread();
  pthread_t o, f;
  REQUIRE(pthread_create(&o, NULL, rounds_owner, NULL) == 0, "pthread_create");
  REQUIRE(pthread_create(&f, NULL, rounds_freer, NULL) == 0, "pthread_create");
  size_t active0 = mt_ctl_size("stats.active"), worst = 0;
  double slowest = 0;
  for (unsigned round = 1; round <= RROUNDS && !atomic_load(&mt_failures); round++) {
    rset(&go_alloc, round);
    rwait(&ready, round);
    /* Sends before and after the owner has been idle MLD_HAND_OVER_IDLE_MS: plain and soon sweep requests. */
    usleep((useconds_t)mt_rng_below(&r, 5000));
    rset(&go_free, round);
    rwait(&freed, round);
    /* Sweeps, hand-overs and reaps bring the pages back within a few sweep ages (16 ms): all but the owner's current
     * page (64 KiB). Allow 2 s and 256 KiB. */
    double t0 = mt_now();
    size_t active = active_at_most(active0 + (256 << 10), 2.0);
    CHECK(active <= active0 + (256 << 10), "round %u: every block of an idle owner freed, %zu KiB active 2 s later, %zu KiB "
          "before the rounds (%llu pages handed over so far)", round, active >> 10, active0 >> 10,
          (unsigned long long)handed());
    if (active > worst) worst = active;
    if (mt_now() - t0 > slowest) slowest = mt_now() - t0;
  }
  pthread_mutex_lock(&astage.mu);
  rquit = true;
  pthread_cond_broadcast(&astage.cv);
  pthread_mutex_unlock(&astage.mu);
  pthread_join(o, NULL);
  pthread_join(f, NULL);
  printf("rounds: %d rounds of %d KiB, %llu pages handed over; active at most %zu KiB (%zu before), back within %.0f ms\n",
         RROUNDS, RBLOCKS * RSIZE >> 10, (unsigned long long)handed(), worst >> 10, active0 >> 10, slowest * 1e3);
  return mt_result("hand_over rounds");
}

/* ---- race ---- */
enum { OWNERS = 2, ROUNDS = 60, PER_ROUND = 6000, RING = 1 << 14 };
typedef struct { uint8_t *p; size_t n; uint64_t tag; } blk_t;
typedef struct { pthread_mutex_t lock; blk_t ring[RING]; size_t head, tail; bool done; } chan_t;
static chan_t chans[OWNERS];

static void check_and_free(blk_t b) {
  size_t bad = mt_verify(b.p, b.n, b.tag);
  CHECK(bad == b.n, "block %p (%zu bytes, tag %llu) damaged at %zu", (void *)b.p, b.n, (unsigned long long)b.tag, bad);
  M_free(mt_hide(b.p));
}

static void *race_owner(void *arg) {
  uintptr_t id = (uintptr_t)arg;
  chan_t *c = &chans[id];
  mt_rng_t r;
  mt_rng_seed(&r, 77 + id);
  static _Thread_local blk_t keep[PER_ROUND];
  for (int round = 0; round < ROUNDS; round++) {
    size_t nkeep = 0;
    for (size_t i = 0; i < PER_ROUND; i++) {
      size_t n = 16 + mt_rng_below(&r, 240);
      blk_t b = { M_malloc(n), n, ((uint64_t)id << 40) | ((uint64_t)round << 20) | i };
      REQUIRE(b.p, "malloc");
      mt_fill(b.p, n, b.tag);
      bool sent = false;
      if (i & 1) {   /* every other block to the freer: each page gets about half back while we idle */
        pthread_mutex_lock(&c->lock);
        if (c->tail - c->head < RING) { c->ring[c->tail++ % RING] = b; sent = true; }
        pthread_mutex_unlock(&c->lock);
      }
      if (!sent) keep[nkeep++] = b;
    }
    usleep(3000 + mt_rng_below(&r, 3000));   /* idle past MLD_HAND_OVER_IDLE_MS: hand-overs may happen */
    for (size_t i = 0; i < nkeep; i++) check_and_free(keep[i]);   /* owner frees racing with them */
  }
  pthread_mutex_lock(&c->lock);
  c->done = true;
  pthread_mutex_unlock(&c->lock);
  return NULL;
}

static void *race_freer(void *arg) {
  chan_t *c = &chans[(uintptr_t)arg];
  mt_rng_t r;
  mt_rng_seed(&r, 991 + (uintptr_t)arg);
  enum { MINE = 512 };
  blk_t mine[MINE] = { { 0 } };
  uint64_t tag = (uint64_t)1 << 60 | (uint64_t)(uintptr_t)arg << 56;
  for (;;) {
    blk_t b;
    bool got = false, done;
    pthread_mutex_lock(&c->lock);
    if (c->head < c->tail) { b = c->ring[c->head++ % RING]; got = true; }
    done = c->done;
    pthread_mutex_unlock(&c->lock);
    if (got) check_and_free(b);
    /* Allocate as well: new pages of these classes come from the handed-over ones first. */
    size_t k = mt_rng_below(&r, MINE);
    if (mine[k].p) check_and_free(mine[k]);
    size_t n = 16 + mt_rng_below(&r, 240);
    mine[k] = (blk_t){ M_malloc(n), n, tag++ };
    REQUIRE(mine[k].p, "malloc");
    mt_fill(mine[k].p, n, mine[k].tag);
    if (!got && done) break;
  }
  for (size_t k = 0; k < MINE; k++)
    if (mine[k].p) check_and_free(mine[k]);
  return NULL;
}

static int run_race(void) {
  uint64_t before = handed();
  pthread_t o[OWNERS], f[OWNERS];
  for (uintptr_t i = 0; i < OWNERS; i++) {
    pthread_mutex_init(&chans[i].lock, NULL);
    REQUIRE(pthread_create(&o[i], NULL, race_owner, (void *)i) == 0, "pthread_create");
    REQUIRE(pthread_create(&f[i], NULL, race_freer, (void *)i) == 0, "pthread_create");
  }
  for (int i = 0; i < OWNERS; i++) {
    pthread_join(o[i], NULL);
    pthread_join(f[i], NULL);
  }
  uint64_t got = handed() - before;
  printf("race: %llu pages handed over\n", (unsigned long long)got);
  CHECK(got > 0, "no page was handed over: the race was not exercised");
  return mt_result("hand_over race");
}

int main(int argc, char **argv) {
  const char *what = argc > 1 ? argv[1] : "adopt";
  if (!strcmp(what, "adopt")) return run_adopt();
  if (!strcmp(what, "race")) return run_race();
  if (!strcmp(what, "reap")) return run_reap();
  if (!strcmp(what, "rounds")) return run_rounds();
  if (!strcmp(what, "reap-wake")) return run_reap_wake();
  fprintf(stderr, "usage: %s adopt|race|reap|rounds|reap-wake\n", argv[0]);
  return 2;
}
