/* test_reclaim.c — pages that other threads emptied come back while their owner lives: a busy owner collects them
 * itself (its refills walk its pages when a sender asks, heap.c "reclaim"), an idle owner's are swept within tens of
 * milliseconds, not a decay period. Run as `busy` (MALLARD_CONF=background_thread:false: no sweep can do it) and as
 * `idle` (dirty_decay_ms:10000: a sweep at the decay delay would come 8.75 s late). `borrow` (narenas:2,
 * dirty_decay_ms:10000): memory one automatic arena holds freed and resident is reused by a thread of another before it
 * maps more (arena.c borrow_dirty); `apart` (the same options): an arena made by arenas.create keeps its own;
 * `dirty_first` (the same): a span is cut from resident memory before purged memory is faulted in again;
 * `first_page` (slab_sizes:160K-256K:16): a heap's first page of a medium class is about one block's size, not the
 * class's 1 MiB; `medium_pages` (defaults): a medium class's pages are at most 256 KiB, or one block's size where a
 * block needs more. Built for ThreadSanitizer too. */
#include "mtest.h"
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

enum { NBLOCKS = 10000, SIZE = 1000 };   /* ~10 MB in 64 KiB pages of 1 KiB blocks: over 150 pages */

static uint8_t *blocks[NBLOCKS];

/* A size_t statistic, refreshed first where the build caches them. */
static size_t stat_now(const char *name) {
  uint64_t epoch = 1;
  size_t len = sizeof epoch;
  MT_CTL("epoch", &epoch, &len, &epoch, sizeof epoch);
  return mt_ctl_size(name);
}
static size_t active(void) { return stat_now("stats.active"); }

static void alloc_blocks(void) {
  for (int i = 0; i < NBLOCKS; i++) {
    blocks[i] = M_malloc(SIZE);
    REQUIRE(blocks[i], "malloc(%d)", SIZE);
    mt_fill(blocks[i], SIZE, (uint64_t)i);
  }
}

/* Another thread frees every block (remote frees, batched; its exit sends what it still holds). */
static void *free_blocks(void *arg) {
  (void)arg;
  for (int i = 0; i < NBLOCKS; i++) {
    size_t bad = mt_verify(blocks[i], SIZE, (uint64_t)i);
    CHECK(bad == SIZE, "block %d damaged at %zu", i, bad);
    M_free(blocks[i]);
  }
  return NULL;
}
static void free_elsewhere(void) {
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, free_blocks, NULL) == 0, "pthread_create");
  REQUIRE(pthread_join(t, NULL) == 0, "pthread_join");
}

/* The owner keeps allocating (other sizes: a refill of another class every round) and never collects on purpose;
 * with no purging thread nothing but its own refills can give the emptied pages back. */
static void case_busy(void) {
  size_t before = active();
  alloc_blocks();
  size_t full = active();
  free_elsewhere();
  enum { ROUND = 3000 };
  static void *tmp[ROUND];
  size_t now = full;
  double t0 = mt_now();
  while (mt_now() - t0 < 3) {
    for (int i = 0; i < ROUND; i++) REQUIRE((tmp[i] = M_malloc(48)) != NULL, "malloc(48)");
    for (int i = 0; i < ROUND; i++) M_free(tmp[i]);
    now = active();
    if (now <= before + 1024 * 1024) break;
  }
  printf("busy: stats.active %zu KiB before, %zu KiB with the blocks, %zu KiB %.3f s after another thread freed them\n",
         before / 1024, full / 1024, now / 1024, mt_now() - t0);
  CHECK(full >= before + 8 * 1024 * 1024, "the blocks did not take the memory expected: %zu KiB", (full - before) / 1024);
  CHECK(now <= before + 1024 * 1024, "a busy owner kept the pages others emptied: %zu KiB active, %zu KiB before",
        now / 1024, before / 1024);
}

/* The owner sleeps: the purging thread sweeps its parked pages once the sweep delay has passed. */
static void case_idle(void) {
  size_t before = active();
  alloc_blocks();
  size_t full = active();
  free_elsewhere();
  size_t now = full;
  double t0 = mt_now();
  while (mt_now() - t0 < 3) {
    usleep(10000);
    now = active();
    if (now <= before + 1024 * 1024) break;
  }
  double took = mt_now() - t0;
  printf("idle: stats.active %zu KiB before, %zu KiB with the blocks, %zu KiB %.3f s after another thread freed them\n",
         before / 1024, full / 1024, now / 1024, took);
  CHECK(full >= before + 8 * 1024 * 1024, "the blocks did not take the memory expected: %zu KiB", (full - before) / 1024);
  CHECK(now <= before + 1024 * 1024, "an idle owner's emptied pages stayed %.1f s: %zu KiB active, %zu KiB before", took,
        now / 1024, before / 1024);
}

/* ---- borrow: dirty spans of one automatic arena serve a thread of another ---- */
enum { NLARGE = 32, LARGE = 512 * 1024 };   /* 16 MiB of large blocks: four segments and more */

static size_t mapped(void) { return stat_now("stats.mapped"); }
/* Allocate NLARGE large blocks, write every byte of them (resident), free them all. */
static void large_round(uint64_t seed) {
  static uint8_t *big[NLARGE];
  for (int i = 0; i < NLARGE; i++) {
    REQUIRE((big[i] = M_malloc(LARGE)) != NULL, "malloc(%d)", LARGE);
    mt_fill(big[i], LARGE, seed + (uint64_t)i);
  }
  for (int i = 0; i < NLARGE; i++) {
    size_t bad = mt_verify(big[i], LARGE, seed + (uint64_t)i);
    CHECK(bad == LARGE, "large block %d damaged at %zu", i, bad);
    M_free(big[i]);
  }
}
/* A thread bound to arena *arg frees 16 MiB of large blocks there. */
static void *round_in_arena(void *arg) {
  unsigned idx = *(unsigned *)arg;
  REQUIRE(MT_CTL("thread.arena", NULL, NULL, &idx, sizeof idx) == 0, "thread.arena := %u", idx);
  large_round(1000);
  return NULL;
}
/* How much more the calling thread (on arena 0) maps for a large round after another thread's round in arena idx. */
static size_t mapped_after_round_in(unsigned idx) {
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, round_in_arena, &idx) == 0, "pthread_create");
  REQUIRE(pthread_join(t, NULL) == 0, "pthread_join");
  REQUIRE(mt_ctl_unsigned("thread.arena") == 0, "the main thread left arena 0 (%u)", mt_ctl_unsigned("thread.arena"));
  size_t before = mapped();
  large_round(2000);
  size_t after = mapped();
  return after > before ? after - before : 0;
}
static void two_arenas(void) {
  unsigned n = mt_ctl_unsigned("arenas.narenas");
  REQUIRE(n >= 2, "two automatic arenas (narenas:2): %u", n);
  M_free(M_malloc(16));   /* the main thread's heap, on arena 0 */
}
static void case_borrow(void) {
  two_arenas();
  size_t grew = mapped_after_round_in(1);
  printf("borrow: after 16 MiB freed in automatic arena 1, a round from arena 0 mapped %zu KiB more\n", grew / 1024);
  CHECK(grew <= 4 * 1024 * 1024, "arena 0 mapped %zu KiB while arena 1 held 16 MiB freed and resident", grew / 1024);
}
/* A created arena lends nothing: a thread bound to it keeps its memory apart (jemalloc's arenas.create). */
static void case_apart(void) {
  two_arenas();
  unsigned made = mt_ctl_unsigned("arenas.create");
  size_t grew = mapped_after_round_in(made);
  printf("apart: after 16 MiB freed in created arena %u, a round from arena 0 mapped %zu KiB more\n", made, grew / 1024);
  CHECK(grew >= 8 * 1024 * 1024, "a created arena lent its memory: arena 0 mapped only %zu KiB more", grew / 1024);
}

/* ---- dirty_first: a span is taken from resident (dirty) memory before purged memory is faulted in again ---- */
enum { SLOT = 64 * 1024 };
/* A purged span of exactly the size asked (best fit) against a larger dirty one: the dirty one serves, so the block is
 * resident before it is written. */
static void case_dirty_first(void) {
  M_free(M_malloc(16));
  uint8_t *a = M_malloc(20 * SLOT), *pad = M_malloc(5 * SLOT), *c = M_malloc(30 * SLOT);
  REQUIRE(a && pad && c, "large blocks");
  mt_fill(a, 20 * SLOT, 1);
  mt_fill(c, 30 * SLOT, 2);
  M_free(a);
  REQUIRE(MT_CTL("arena.0.purge", NULL, NULL, NULL, 0) == 0, "arena.0.purge");   /* a's span: purged, 20 slots */
  M_free(c);                                                                       /* c's: dirty, 30 slots */
  uint8_t *x = M_malloc(20 * SLOT);
  REQUIRE(x, "malloc(20 slots)");
  size_t total, in = mt_resident_pages(x, 20 * SLOT, &total);
  printf("dirty_first: a 20-slot block after a purged 20-slot span and a dirty 30-slot one: %zu of %zu pages resident "
         "(%s)\n", in, total, x == c ? "the dirty span" : x == a ? "the purged span" : "elsewhere");
  CHECK(in * 10 >= total * 9, "the block came from memory not resident (%zu of %zu pages): purged before dirty", in, total);
  M_free(x);
  M_free(pad);
}

/* ---- first_page (slab_sizes:160K-256K:16): under pages of several blocks, a heap's first page of a medium class
 * holds about one block, its next ones the class's page ---- */
static void case_first_page(void) {
  enum { BIG = 200 * 1024 };   /* the 224 KiB class: 1 MiB pages (slab_sizes), 4 slots hold one block */
  M_free(M_malloc(16));
  size_t before = active();
  uint8_t *a = M_malloc(BIG);
  REQUIRE(a, "malloc(%d)", BIG);
  size_t one = active() - before;
  uint8_t *b = M_malloc(BIG), *c = M_malloc(BIG);
  REQUIRE(b && c, "malloc(%d)", BIG);
  size_t three = active() - before;
  mt_fill(a, BIG, 1);
  mt_fill(b, BIG, 2);
  mt_fill(c, BIG, 3);
  CHECK(mt_verify(a, BIG, 1) == BIG && mt_verify(b, BIG, 2) == BIG && mt_verify(c, BIG, 3) == BIG, "blocks damaged");
  printf("first_page: one %d-byte block made %zu KiB active, three %zu KiB\n", BIG, one / 1024, three / 1024);
  CHECK(one <= 320 * 1024, "the first block of a medium class took a %zu KiB page", one / 1024);
  CHECK(three >= 1024 * 1024, "later pages of the class are not the class's page size: %zu KiB for three blocks",
        three / 1024);
  M_free(a);
  M_free(b);
  M_free(c);
}

/* ---- medium_pages (defaults): a medium class's pages are at most 256 KiB (4 slots), or the fewest slots that hold a
 * block, so that a thread holding a few blocks of a class pins about their size, not up to 1 MiB (mstress, issue 39).
 * A heap's first page of a class holds one block; N blocks then take at most 1 + ceil((N - 1) / per page) pages. */
static void case_medium_pages(void) {
  static const size_t sizes[] = { 20 * 1024, 50 * 1024, 100 * 1024, 200 * 1024 };
  enum { N = 6, CAP = 4 * SLOT };   /* SLOT: the file's 64 KiB slot (above) */
  M_free(M_malloc(16));
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    size_t before = active();
    uint8_t *p[N];
    for (int k = 0; k < N; k++) {
      p[k] = M_malloc(sizes[i]);
      REQUIRE(p[k], "malloc(%zu)", sizes[i]);
      mt_fill(p[k], sizes[i], (uint64_t)k);
    }
    size_t grew = active() - before;
    size_t bs = M_usable(p[0]);                                /* the class's block size */
    size_t fit = (bs + SLOT - 1) / SLOT * SLOT;                 /* the fewest slots that hold one block */
    size_t page = fit > CAP ? fit : CAP, per_page = page / bs;
    size_t limit = fit + (N - 1 + per_page - 1) / per_page * page;
    printf("medium_pages: %d blocks of %zu bytes (class %zu) made %zu KiB active; at most %zu KiB expected\n", N,
           sizes[i], bs, grew / 1024, limit / 1024);
    CHECK(grew <= limit, "%d blocks of %zu bytes took %zu KiB of pages, more than %zu KiB", N, sizes[i], grew / 1024,
          limit / 1024);
    for (int k = 0; k < N; k++) {
      CHECK(mt_verify(p[k], sizes[i], (uint64_t)k) == sizes[i], "block %d of %zu bytes damaged", k, sizes[i]);
      M_free(p[k]);
    }
  }
}

int main(int argc, char **argv) {
  const char *c = argc > 1 ? argv[1] : "busy";
  if (!strcmp(c, "busy")) case_busy();
  else if (!strcmp(c, "idle")) case_idle();
  else if (!strcmp(c, "borrow")) case_borrow();
  else if (!strcmp(c, "apart")) case_apart();
  else if (!strcmp(c, "dirty_first")) case_dirty_first();
  else if (!strcmp(c, "first_page")) case_first_page();
  else if (!strcmp(c, "medium_pages")) case_medium_pages();
  else REQUIRE(0, "unknown case %s (busy, idle, borrow, apart, dirty_first, first_page, medium_pages)", c);
  return mt_result("reclaim");
}
