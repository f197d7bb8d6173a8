/* test_succession.c — a thread's heap outlives it as an orphan: the next thread to start takes it over whole (its
 * blocks are then that thread's own), a heap bound to an arena is not passed on, counters start afresh, an orphan
 * nobody claims is abandoned by a sweep and its memory comes back, and chains of threads handing blocks on race with
 * remote frees and forced collections. Built for ThreadSanitizer too. */
#include "mtest.h"
#include <pthread.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

enum { NBLOCKS = 3000 };

typedef struct { uint8_t *p; size_t n; uint64_t tag; } blk_t;
static blk_t blocks[NBLOCKS];

static void run_thread(void *(*fn)(void *), void *arg) {
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, fn, arg) == 0, "pthread_create");
  REQUIRE(pthread_join(t, NULL) == 0, "pthread_join");
}

/* Small blocks of every size up to 1000 bytes and some medium ones: many classes, many pages. */
static void *fill(void *arg) {
  uint64_t seed = (uint64_t)(uintptr_t)arg;
  mt_rng_t r;
  mt_rng_seed(&r, seed);
  for (int i = 0; i < NBLOCKS; i++) {
    size_t n = i % 50 == 0 ? 8192 + mt_rng_below(&r, 60000) : 16 + mt_rng_below(&r, 985);
    uint8_t *p = M_malloc(n);
    REQUIRE(p, "malloc(%zu)", n);
    mt_fill(p, n, seed * 100000 + (uint64_t)i);
    blocks[i] = (blk_t){ p, n, seed * 100000 + (uint64_t)i };
  }
  return NULL;
}

static void free_all(void) {   /* every block not freed yet */
  for (int i = 0; i < NBLOCKS; i++) {
    if (!blocks[i].p) continue;
    size_t bad = mt_verify(blocks[i].p, blocks[i].n, blocks[i].tag);
    CHECK(bad == blocks[i].n, "block %d damaged at %zu", i, bad);
    M_free(blocks[i].p);
    blocks[i].p = NULL;
  }
}

/* The successor frees what its predecessor allocated: every free is its own (no remote free is counted), and its
 * byte counters start at zero although its heap is the predecessor's. */
static uint64_t remote_in_successor, allocated_in_successor;
static void *successor(void *arg) {
  (void)arg;
  void *probe = M_malloc(100);   /* takes its heap: the orphan left by fill() */
  REQUIRE(probe, "malloc(100)");
  allocated_in_successor = mt_ctl_u64("thread.allocated");
  uint64_t before = mt_ctl_u64("stats.remote_frees");
  free_all();
  remote_in_successor = mt_ctl_u64("stats.remote_frees") - before;
  M_free(probe);
  return NULL;
}

static void case_inherit(void) {
  MT_COLLECT(true);   /* no orphans of earlier threads: the successor takes fill()'s heap */
  run_thread(fill, (void *)(uintptr_t)1);
  run_thread(successor, NULL);
  printf("inherit: %llu remote frees among %d frees of the predecessor's blocks; successor's thread.allocated %llu\n",
         (unsigned long long)remote_in_successor, NBLOCKS, (unsigned long long)allocated_in_successor);
  CHECK(remote_in_successor == 0, "the successor's frees of its predecessor's blocks were remote: %llu",
        (unsigned long long)remote_in_successor);
  CHECK(allocated_in_successor < 4096, "the successor's thread.allocated starts at its predecessor's: %llu",
        (unsigned long long)allocated_in_successor);
}

/* Two orphans, the newer one a bystander's: a thread whose first call frees a block of the older one takes that one
 * over, not the list's head, and its frees of the rest are its own (larson's successor starts by freeing what its
 * predecessor handed it, while other threads come and go). */
static _Atomic(int) by_go, by_ready;
static void *bystander(void *arg) {
  (void)arg;
  M_free(mt_hide(M_malloc(48)));   /* its heap exists before fill()'s thread exits: it takes no orphan */
  atomic_store(&by_ready, 1);
  while (!atomic_load(&by_go)) usleep(1000);
  return NULL;                     /* exits after fill()'s thread: its orphan is the newer */
}
static uint64_t remote_after_first;
static void *free_first(void *arg) {
  (void)arg;
  size_t bad = mt_verify(blocks[0].p, blocks[0].n, blocks[0].tag);
  CHECK(bad == blocks[0].n, "block 0 damaged at %zu", bad);
  M_free(blocks[0].p);   /* the first call: takes the heap (and is itself a remote free) */
  blocks[0].p = NULL;
  uint64_t before = mt_ctl_u64("stats.remote_frees");
  free_all();
  remote_after_first = mt_ctl_u64("stats.remote_frees") - before;
  return NULL;
}
static void case_prefer(void) {
  MT_COLLECT(true);
  pthread_t b;
  REQUIRE(pthread_create(&b, NULL, bystander, NULL) == 0, "pthread_create");
  while (!atomic_load(&by_ready)) usleep(1000);
  run_thread(fill, (void *)(uintptr_t)5);   /* the older orphan */
  atomic_store(&by_go, 1);
  REQUIRE(pthread_join(b, NULL) == 0, "pthread_join");   /* the newer orphan */
  run_thread(free_first, NULL);
  printf("prefer: %llu remote frees among the %d frees after the first\n", (unsigned long long)remote_after_first,
         NBLOCKS - 1);
  CHECK(remote_after_first == 0, "a thread that first freed a block of an older orphan did not take it over: %llu "
        "of the other frees were remote", (unsigned long long)remote_after_first);
}

/* A thread bound to an arena does not pass its heap (and its binding) on. */
static unsigned arena_of_successor;
static void *bind_and_fill(void *arg) {
  unsigned idx = *(unsigned *)arg;
  REQUIRE(MT_CTL("thread.arena", NULL, NULL, &idx, sizeof idx) == 0, "thread.arena = %u", idx);
  return fill((void *)(uintptr_t)2);
}
static void *read_arena(void *arg) {
  (void)arg;
  void *p = M_malloc(64);
  REQUIRE(p, "malloc(64)");
  arena_of_successor = mt_ctl_unsigned("thread.arena");
  M_free(p);
  return NULL;
}
static void case_bound(void) {
  MT_COLLECT(true);
  unsigned idx = 0;
  size_t len = sizeof idx;
  REQUIRE(MT_CTL("arenas.create", &idx, &len, NULL, 0) == 0, "arenas.create");
  REQUIRE(idx > 0, "a new arena has an index above 0: %u", idx);
  run_thread(bind_and_fill, &idx);
  run_thread(read_arena, NULL);
  printf("bound: the bound thread's arena %u, its successor's %u\n", idx, arena_of_successor);
  CHECK(arena_of_successor != idx, "a successor took over a heap bound to arena %u", idx);
  free_all();
}

/* Nobody takes the orphan: a thread that was running before it exited frees its blocks (remote frees) and exits
 * too (its outbox is sent as it does), and within a few decay periods (200 ms here) sweeps abandon both orphans and
 * their pages leave, without any collection asked for. */
static _Atomic(int) go, ready;
static void *late_freer(void *arg) {
  (void)arg;
  M_free(mt_hide(M_malloc(32)));   /* its heap exists before fill()'s thread exits: it takes no orphan */
  atomic_store(&ready, 1);         /* its counters written before: main's reads of the statistics come after */
  while (!atomic_load(&go)) usleep(1000);
  free_all();
  return NULL;
}
static void case_unclaimed(void) {
  MT_COLLECT(true);
  size_t active0 = mt_ctl_size("stats.active");
  pthread_t f;
  REQUIRE(pthread_create(&f, NULL, late_freer, NULL) == 0, "pthread_create");
  while (!atomic_load(&ready)) usleep(1000);
  run_thread(fill, (void *)(uintptr_t)3);
  size_t active1 = mt_ctl_size("stats.active");
  atomic_store(&go, 1);
  pthread_join(f, NULL);
  size_t active = 0;
  double t0 = mt_now();
  while (mt_now() - t0 < 5) {
    active = mt_ctl_size("stats.active");
    if (active <= active0 + 64 * 1024) break;
    usleep(20000);
  }
  printf("unclaimed: stats.active %zu KiB before, %zu KiB with the orphan, %zu KiB %.2f s after its blocks were freed\n",
         active0 / 1024, active1 / 1024, active / 1024, mt_now() - t0);
  CHECK(active <= active0 + 64 * 1024, "the unclaimed orphan's pages stayed: %zu KiB active, %zu KiB before",
        active / 1024, active0 / 1024);
}

/* A fork child keeps the parent's orphans: a thread it starts takes one over (its frees of the blocks are its own),
 * and so does a thread of the parent. Not under ThreadSanitizer (no fork from a threaded process there). */
static void case_fork(void) {
#ifndef __SANITIZE_THREAD__
  MT_COLLECT(true);
  run_thread(fill, (void *)(uintptr_t)4);
  fflush(stdout);
  pid_t pid = fork();
  REQUIRE(pid >= 0, "fork");
  if (pid == 0) {
    run_thread(successor, NULL);
    printf("fork: in the child, %llu remote frees among %d frees of the orphan's blocks\n",
           (unsigned long long)remote_in_successor, NBLOCKS);
    fflush(stdout);
    _exit(remote_in_successor == 0 && atomic_load(&mt_failures) == 0 ? 0 : 1);
  }
  int st = 0;
  REQUIRE(waitpid(pid, &st, 0) == pid, "waitpid");
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the fork child's thread did not take the orphan over (status %d)", st);
  run_thread(successor, NULL);
  CHECK(remote_in_successor == 0, "after the fork, the parent's successor freed remotely: %llu",
        (unsigned long long)remote_in_successor);
#endif
}

/* ---- stress: chains of threads hand their blocks on while freers and a collector run ---- */
enum { LANES = 4, GENERATIONS = 24, LANE_BLOCKS = 400, POOL = LANES * GENERATIONS * LANE_BLOCKS };
typedef struct { blk_t b[LANE_BLOCKS]; mt_rng_t r; int gen; uint64_t id; pthread_t chain[GENERATIONS]; } lane_t;
static lane_t lanes[LANES];
static blk_t pool[POOL];
static _Atomic(size_t) pool_put_at, pool_take_at;
static _Atomic(int) stop;

static void *generation(void *arg) {
  lane_t *l = arg;
  for (int i = 0; i < LANE_BLOCKS; i++) {
    blk_t *b = &l->b[i];
    if (b->p) {
      size_t bad = mt_verify(b->p, b->n, b->tag);
      CHECK(bad == b->n, "lane block damaged at %zu", bad);
      if (mt_rng_below(&l->r, 4) == 0) {   /* a quarter to the freers: remote frees into an orphan or its successor */
        size_t at = atomic_fetch_add(&pool_put_at, 1);
        REQUIRE(at < POOL, "pool overflow");
        pool[at].n = b->n;
        pool[at].tag = b->tag;
        __atomic_store_n(&pool[at].p, b->p, __ATOMIC_RELEASE);   /* the freer waits for p */
        b->p = NULL;
      } else if (mt_rng_below(&l->r, 2) == 0) {   /* freed here: blocks of the predecessor, now our own */
        M_free(b->p);
        b->p = NULL;
      }
    }
    if (!b->p) {
      b->n = mt_rng_below(&l->r, 16) == 0 ? 8192 + mt_rng_below(&l->r, 30000) : 16 + mt_rng_below(&l->r, 1000);
      b->tag = ++l->id;
      b->p = M_malloc(b->n);
      REQUIRE(b->p, "malloc(%zu)", b->n);
      mt_fill(b->p, b->n, b->tag);
    }
  }
  /* The successor starts before this thread has exited; nothing of the lane is touched after the create. */
  if (++l->gen < GENERATIONS) REQUIRE(pthread_create(&l->chain[l->gen], NULL, generation, l) == 0, "pthread_create");
  return NULL;
}

static void *freer(void *arg) {
  (void)arg;
  for (;;) {
    size_t at = atomic_load(&pool_take_at);
    if (at >= atomic_load(&pool_put_at)) {
      if (atomic_load(&stop) && at >= atomic_load(&pool_put_at)) return NULL;
      sched_yield();
      continue;
    }
    if (!atomic_compare_exchange_weak(&pool_take_at, &at, at + 1)) continue;
    /* pool_put_at passed `at` before its writer filled the slot: p, stored last, says it is whole */
    blk_t b;
    while (!(b.p = __atomic_load_n(&pool[at].p, __ATOMIC_ACQUIRE))) sched_yield();
    b.n = pool[at].n;
    b.tag = pool[at].tag;
    size_t bad = mt_verify(b.p, b.n, b.tag);
    CHECK(bad == b.n, "pooled block damaged at %zu", bad);
    M_free(b.p);
  }
}

static void *collector(void *arg) {
  (void)arg;
  while (!atomic_load(&stop)) {
    MT_COLLECT(true);   /* abandons orphans while successors may be starting */
    usleep(300);
  }
  return NULL;
}

static void case_stress(void) {
  pthread_t fr[2], col;
  for (int i = 0; i < 2; i++) REQUIRE(pthread_create(&fr[i], NULL, freer, NULL) == 0, "pthread_create");
  REQUIRE(pthread_create(&col, NULL, collector, NULL) == 0, "pthread_create");
  for (int i = 0; i < LANES; i++) {
    mt_rng_seed(&lanes[i].r, 77 + (uint64_t)i);
    lanes[i].id = (uint64_t)i << 40;
    REQUIRE(pthread_create(&lanes[i].chain[0], NULL, generation, &lanes[i]) == 0, "pthread_create");
  }
  for (int i = 0; i < LANES; i++)   /* chain[g + 1] was written by generation g before it ended */
    for (int g = 0; g < GENERATIONS; g++) REQUIRE(pthread_join(lanes[i].chain[g], NULL) == 0, "pthread_join");
  atomic_store(&stop, 1);
  for (int i = 0; i < 2; i++) pthread_join(fr[i], NULL);
  pthread_join(col, NULL);
  size_t n = 0;
  for (int i = 0; i < LANES; i++)
    for (int k = 0; k < LANE_BLOCKS; k++) {
      blk_t *b = &lanes[i].b[k];
      size_t bad = mt_verify(b->p, b->n, b->tag);
      CHECK(bad == b->n, "final lane block damaged at %zu", bad);
      M_free(b->p);
      n++;
    }
  printf("stress: %d lanes x %d generations, %zu blocks through the freers, %zu left at the end\n", LANES, GENERATIONS,
         atomic_load(&pool_put_at), n);
}

/* A page none of whose blocks is live is carved afresh, in address order, when its heap is taken over: the blocks
 * of a page then come in ascending order, not in the random order its predecessor freed them in (a cache miss per
 * malloc: mstress, docs/PERFORMANCE.md). FRESH_N blocks of an unusual size span several pages; consecutive blocks of
 * one page must ascend. */
enum { FRESH_N = 200, FRESH_SIZE = 2900 };
static void *fresh[FRESH_N];

static void fresh_alloc(const char *what) {
  for (int i = 0; i < FRESH_N; i++) {
    fresh[i] = M_malloc(FRESH_SIZE);
    REQUIRE(fresh[i], "malloc(%d)", FRESH_SIZE);
    memset(fresh[i], 0x33, FRESH_SIZE);
  }
  int descents = 0, same_page = 0;
  for (int i = 1; i < FRESH_N; i++) {
    if (((uintptr_t)fresh[i] >> 16) != ((uintptr_t)fresh[i - 1] >> 16)) continue;   /* 64 KiB pages (one slot) */
    same_page++;
    if ((uintptr_t)fresh[i] < (uintptr_t)fresh[i - 1]) descents++;
  }
  CHECK(same_page > FRESH_N / 2, "%s: %d of %d consecutive blocks in one page", what, same_page, FRESH_N - 1);
  CHECK(descents == 0, "%s: %d of %d consecutive blocks of one page descend (a recycled free list)", what, descents,
        same_page);
}

static void fresh_free_shuffled(uint64_t seed) {
  mt_rng_t r;
  mt_rng_seed(&r, seed);
  for (int i = FRESH_N - 1; i > 0; i--) {
    int j = (int)mt_rng_below(&r, (uint64_t)i + 1);
    void *t = fresh[i];
    fresh[i] = fresh[j];
    fresh[j] = t;
  }
  for (int i = 0; i < FRESH_N; i++) M_free(fresh[i]);
}

static void *fresh_exiting_owner(void *arg) {
  (void)arg;
  fresh_alloc("first owner");
  fresh_free_shuffled(7);   /* its own frees, in random order: empty pages with random free lists, kept as it exits */
  return NULL;
}
static void *fresh_successor(void *arg) {
  (void)arg;
  void *probe = M_malloc(100);   /* takes the orphan over: the next mallocs of the class run on the fast path */
  REQUIRE(probe, "malloc(100)");
  fresh_alloc("successor");
  fresh_free_shuffled(8);
  M_free(probe);
  return NULL;
}

static void case_fresh(void) {
  MT_COLLECT(true);   /* no orphans of earlier threads: the successor takes the first owner's heap */
  run_thread(fresh_exiting_owner, NULL);
  run_thread(fresh_successor, NULL);
  printf("fresh: %d blocks of %d bytes ascend within their pages after a take-over\n", FRESH_N, FRESH_SIZE);
}

int main(int argc, char **argv) {
  const char *c = argc > 1 ? argv[1] : "all";
  bool all = !strcmp(c, "all");
  if (all || !strcmp(c, "inherit")) case_inherit();
  if (all || !strcmp(c, "prefer")) case_prefer();
  if (all || !strcmp(c, "bound")) case_bound();
  if (all || !strcmp(c, "unclaimed")) case_unclaimed();
  if (all || !strcmp(c, "fork")) case_fork();
  if (all || !strcmp(c, "fresh")) case_fresh();
  if (all || !strcmp(c, "stress")) case_stress();
  return mt_result("succession");
}
