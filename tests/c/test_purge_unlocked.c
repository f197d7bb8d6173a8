/* test_purge_unlocked.c — a purge pass runs madvise without its arena's lock: spans being purged are nobody else's. */
/* mld_arena_purge takes the spans due out of the free lists (PAGE_PURGING), releases the arena lock for the madvise
 * calls and lists them again after. Two cases, one arena (narenas:1) so that every thread meets every pass:
 *   stress — workers allocate, fill, grow, check and free large blocks (some by calloc: zero) while other
 *            threads purge the arena in a loop; a span handed out, grown into or joined while it was being purged
 *            would lose a block's bytes to madvise, or hand out non-zero memory as zero. Then the arena's lists and
 *            counters must agree with its segments (no span left out, none PAGE_PURGING).
 *   fork   — a thread purges in a loop while the main thread forks: a child made while spans were out for purging
 *            must have them listed again (the fork handler; the parent's purging thread does not exist there), with
 *            consistent lists, and calloc must still read zero. The case fails if no child met a pass in flight.
 *   contended — a pass that waits for the lock again after its madvise calls must not mark its thread as having
 *            waited for its arena (that moves the thread to another arena: heap.c mld_heap_arena). */
#include "mtest.h"
#include "core/core.h"
#include <pthread.h>
#include <sys/wait.h>

#define KiB ((size_t)1024)
#define WORKERS 3
#define PURGERS 2
#define LIVE 6

static _Atomic(int) stop;

/* The arena's free spans walked through its segments must be what its lists and counters say (lock held, or the
 * only thread of a fork child). */
static void check_arena(arena_t *a, const char *when) {
  CHECK(a->purging == NULL, "%s: spans still out for purging", when);
  size_t dirty = 0, purged = 0;
  for (segment_t *seg = a->segments; seg; seg = seg->next) {
    size_t free_slots = 0;
    for (size_t i = MLD_FIRST_SLOT; i < MLD_SLOTS;) {
      page_t *pg = &seg->pages[i];
      size_t n = pg->slot_count;
      if (!n) { CHECK(0, "%s: slot %zu starts no span", when, i); break; }
      CHECK(pg->kind == PAGE_FREE || pg->kind == PAGE_SMALL || pg->kind == PAGE_LARGE, "%s: span at slot %zu of kind %u",
            when, i, pg->kind);
      if (pg->kind == PAGE_FREE) {
        free_slots += n;
        if (pg->purged) purged += n; else dirty += n;
      }
      i += n;
    }
    CHECK(free_slots == seg->free_slots, "%s: segment %p: %zu free slots in spans, %u counted", when, (void *)seg,
          free_slots, seg->free_slots);
  }
  CHECK(dirty == a->dirty_slots && purged == a->purged_slots, "%s: spans dirty %zu purged %zu, counters %zu and %zu",
        when, dirty, purged, a->dirty_slots, a->purged_slots);
}

/* Sampled bytes of a calloc'd block that are not zero (one per 64). */
static size_t nonzero_samples(const uint8_t *p, size_t n) {
  size_t nz = 0;
  for (size_t i = 0; i < n; i += 64) nz += p[i] != 0;
  return nz;
}

static void purge_arena0(void) {
  REQUIRE(MT_CTL("arena.0.purge", NULL, NULL, NULL, 0) == 0, "arena.0.purge");
}

static void *purger(void *arg) {
  (void)arg;
  while (!atomic_load_explicit(&stop, memory_order_relaxed)) purge_arena0();
  return NULL;
}

/* Large blocks (spans of slots) of random sizes, allocated, checked and freed in random order. */
static void *worker(void *arg) {
  uintptr_t id = (uintptr_t)arg;
  mt_rng_t r;
  mt_rng_seed(&r, 0x9e37 + id);
  struct { uint8_t *p; size_t n; uint64_t tag; } live[LIVE] = { { 0 } };
  uint64_t tag = id << 32;
  size_t lo = MLD_MEDIUM_MAX + 1, span = 16 * MLD_SLOT_SIZE;
  while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
    unsigned k = (unsigned)mt_rng_below(&r, LIVE);
    if (live[k].p && mt_rng_below(&r, 4) == 0 && live[k].n < lo + span) {
      /* grown in place where the span after it is free (mld_arena_grow_large), else moved */
      size_t n = live[k].n + MLD_SLOT_SIZE / 2 + mt_rng_below(&r, 2 * MLD_SLOT_SIZE);
      uint8_t *q = M_realloc(live[k].p, n);
      REQUIRE(q, "realloc(%zu)", n);
      size_t bad = mt_verify(q, live[k].n, live[k].tag);
      CHECK(bad == live[k].n, "block %p grown to %zu bytes wrong at byte %zu", (void *)q, n, bad);
      if (bad != live[k].n) return NULL;
      live[k].p = q;
      live[k].n = n;
      live[k].tag = ++tag;
      mt_fill(q, n, live[k].tag);
      continue;
    }
    if (live[k].p) {
      size_t bad = mt_verify(live[k].p, live[k].n, live[k].tag);
      CHECK(bad == live[k].n, "block %p (%zu bytes) wrong at byte %zu: its span was purged under it", (void *)live[k].p,
            live[k].n, bad);
      M_free(live[k].p);
      live[k].p = NULL;
      if (bad != live[k].n) return NULL;
      continue;
    }
    size_t n = lo + mt_rng_below(&r, span);
    uint8_t *p;
    if (mt_rng_below(&r, 2)) {
      p = M_calloc(1, n);
      REQUIRE(p, "calloc(%zu)", n);
      size_t nz = nonzero_samples(p, n);
      CHECK(nz == 0, "calloc(%zu) returned %zu non-zero bytes", n, nz);
      if (nz) return NULL;
    } else {
      p = M_malloc(n);
      REQUIRE(p, "malloc(%zu)", n);
    }
    live[k].p = p;
    live[k].n = n;
    live[k].tag = ++tag;
    mt_fill(p, n, live[k].tag);
  }
  for (unsigned k = 0; k < LIVE; k++) M_free(live[k].p);
  return NULL;
}

static void test_stress(double secs) {
  pthread_t w[WORKERS], pu[PURGERS];
  for (uintptr_t i = 0; i < WORKERS; i++) REQUIRE(pthread_create(&w[i], NULL, worker, (void *)i) == 0, "create");
  for (int i = 0; i < PURGERS; i++) REQUIRE(pthread_create(&pu[i], NULL, purger, NULL) == 0, "create");
  usleep((useconds_t)(secs * 1e6));
  atomic_store(&stop, 1);
  for (int i = 0; i < WORKERS; i++) pthread_join(w[i], NULL);
  for (int i = 0; i < PURGERS; i++) pthread_join(pu[i], NULL);
  arena_t *a = mld_arena_get(0);
  REQUIRE(a, "arena 0");
  uint64_t passes = a->npurge_passes;
  purge_arena0();
  pthread_mutex_lock(&a->lock);
  check_arena(a, "after the stress");
  pthread_mutex_unlock(&a->lock);
  CHECK(passes > 100, "only %llu purge passes ran", (unsigned long long)passes);
}

/* LIVE large blocks touched (resident) and freed: dirty spans for the next pass to purge. */
static void dirty_spans(void) {
  uint8_t *p[LIVE];
  for (int k = 0; k < LIVE; k++) {
    p[k] = M_malloc(3 * MLD_SLOT_SIZE);
    REQUIRE(p[k], "malloc");
    memset(mt_hide(p[k]), 0x5a, 3 * MLD_SLOT_SIZE);
  }
  for (int k = 0; k < LIVE; k++) M_free(p[k]);
}

/* Dirties and purges spans until stopped: most of its time is in madvise. */
static void *churn_purge(void *arg) {
  (void)arg;
  while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
    dirty_spans();
    purge_arena0();
  }
  return NULL;
}

static void test_fork(int forks) {
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, churn_purge, NULL) == 0, "create");
  int met = 0, bad = 0;
  for (int i = 0; i < forks && !bad && met < 5; i++) {
    usleep(500 + (useconds_t)(i % 7) * 150);
    pid_t pid = fork();
    REQUIRE(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
      /* The child's only thread: nothing else can change the arena now. 2: a pass was in flight at the fork. */
      arena_t *a = mld_arena_get(0);
      int code = mld_arenas_fork_relisted ? 2 : 0;
      check_arena(a, "fork child");
      for (int k = 0; k < 2 * LIVE; k++) {
        size_t n = 3 * MLD_SLOT_SIZE;
        uint8_t *p = M_calloc(1, n);
        if (!p) _exit(1);
        size_t nz = nonzero_samples(p, n);
        CHECK(nz == 0, "fork child: calloc(%zu) returned %zu non-zero bytes", n, nz);
      }
      _exit(atomic_load(&mt_failures) ? 1 : code);
    }
    int st = 0;
    REQUIRE(waitpid(pid, &st, 0) == pid, "waitpid");
    if (!WIFEXITED(st) || WEXITSTATUS(st) == 1) bad++;
    else if (WEXITSTATUS(st) == 2) met++;
  }
  atomic_store(&stop, 1);
  pthread_join(t, NULL);
  CHECK(!bad, "a fork child found the arena inconsistent (status above)");
  CHECK(met > 0, "no fork met a purge pass in flight in %d forks: the case tested nothing", forks);
  printf("fork: %d children met a purge pass in flight\n", met);
}

/* Holds arena 0's lock 200 us at a time, until stopped. */
static void *lock_holder(void *arg) {
  arena_t *a = arg;
  while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
    pthread_mutex_lock(&a->lock);
    usleep(200);
    pthread_mutex_unlock(&a->lock);
    usleep(50);
  }
  return NULL;
}

static void test_contended(int tries) {
  arena_t *a = mld_arena_get(0);
  REQUIRE(a, "arena 0");
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, lock_holder, a) == 0, "create");
  int waited = 0, marked = 0;
  for (int i = 0; i < tries && waited < 20; i++) {
    dirty_spans();
    pthread_mutex_lock(&a->lock);   /* taken plainly: only the pass's own second acquisition can mark the thread */
    uint64_t before = a->lock_stats.contended;
    mld_tls_contended = false;
    mld_arena_purge(a, true);
    bool again = a->lock_stats.contended != before, mark = mld_tls_contended;
    pthread_mutex_unlock(&a->lock);
    mld_tls_contended = false;
    waited += again;
    marked += again && mark;
  }
  atomic_store(&stop, 1);
  pthread_join(t, NULL);
  CHECK(waited > 0, "no pass waited for the lock again in %d tries: the case tested nothing", tries);
  CHECK(marked == 0, "%d of %d passes that waited for the lock again marked their thread as contended", marked, waited);
  printf("contended: %d passes waited for the lock after madvise\n", waited);
}

int main(int argc, char **argv) {
  const char *which = argc > 1 ? argv[1] : "stress";
  double secs = argc > 2 ? atof(argv[2]) : 2.0;
  if (!strcmp(which, "stress")) test_stress(secs);
  else if (!strcmp(which, "fork")) test_fork(argc > 2 ? atoi(argv[2]) : 400);
  else if (!strcmp(which, "contended")) test_contended(argc > 2 ? atoi(argv[2]) : 2000);
  else REQUIRE(0, "unknown case %s", which);
  return mt_result("test_purge_unlocked");
}
