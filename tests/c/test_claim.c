/* test_claim.c — a page whose every block has been freed by other threads leaves its owner: a parked one at the send
 * that brings back its last blocks (heap.c mld_heap_give_emptied, stats.pages_emptied), any other (not current) when
 * a thread that needs a new page claims it (heap.c claim_parked). `emptied` checks that exactly the parked pages of a
 * blocked owner go back to the arena as the last frees are sent, before anyone allocates; `take` that a thread that
 * needs pages then gets them, with sound blocks; `current` that an owner's current page is never taken, `orphan` that
 * an orphan's is claimed; `outbox` that a refill sends the thread's own last frees into such a page before it looks
 * for one; `race` has owners freeing their own blocks of parked pages (the locked path) while other threads free the
 * rest remotely and take those pages as they empty, every block carrying a pattern checked before it is freed.
 * `race` is built for ThreadSanitizer and the race-delay build too. */
#include "mtest.h"
#include <pthread.h>
#include <sched.h>

static uint64_t claimed(void) { return mt_ctl_u64("stats.pages_claimed"); }
static uint64_t emptied(void) { return mt_ctl_u64("stats.pages_emptied"); }
static uint64_t taken(void) { return claimed() + emptied(); }   /* either way the page left its owner */

static bool in_pages(void *const *blocks, size_t n, const void *p) {   /* small pages are one 64 KiB slot */
  for (size_t i = 0; i < n; i++)
    if (((uintptr_t)blocks[i] >> 16) == ((uintptr_t)p >> 16)) return true;
  return false;
}

/* n blocks of `size` bytes into b, block i filled with the pattern of tag0 + i. */
static void alloc_filled(void **b, size_t n, size_t size, uint64_t tag0) {
  for (size_t i = 0; i < n; i++) {
    b[i] = M_malloc(size);
    REQUIRE(b[i], "malloc");
    mt_fill(b[i], size, tag0 + i);
  }
}

/* ---- take ---- */
enum { TBLOCKS = 16384, TSIZE = 64 };   /* 16 pages of 1024 blocks: all but the last two parked */
static void *tblk[TBLOCKS];
static mt_stage_t tstage = MT_STAGE_INIT;   /* 1: the owner's blocks are ready; 2: the owner may exit */

static void *take_owner(void *arg) {
  (void)arg;
  alloc_filled(tblk, TBLOCKS, TSIZE, 0);
  mt_stage_set(&tstage, 1);
  mt_stage_wait(&tstage, 2);   /* blocked: it never refills, so only a claim can reuse its pages */
  return NULL;
}

/* Run with background_thread:false: no sweep gives the owner's emptied parked pages back to the arena first. */
static int run_take(void) {
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, take_owner, NULL) == 0, "pthread_create");
  mt_stage_wait(&tstage, 1);
  uint64_t before = taken();
  for (size_t i = 0; i < TBLOCKS; i++) {   /* every block comes back, as remote frees */
    size_t bad = mt_verify(tblk[i], TSIZE, i);
    CHECK(bad == TSIZE, "block %zu damaged at %zu", i, bad);
    M_free(mt_hide(tblk[i]));
  }
  mt_flush_outbox();
  enum { MINE = 8192 };
  static void *mine[MINE];
  size_t inside = 0;
  alloc_filled(mine, MINE, TSIZE, 1000000);
  for (size_t i = 0; i < MINE; i++) inside += in_pages(tblk, TBLOCKS, mine[i]);
  uint64_t got = taken() - before;
  CHECK(got > 0, "no page of the blocked owner was given back or claimed");
  CHECK(inside > 0, "none of %d new blocks came from the owner's emptied pages", MINE);
  for (size_t i = 0; i < MINE; i++) {   /* a block handed out twice would carry another's pattern */
    size_t bad = mt_verify(mine[i], TSIZE, 1000000 + i);
    CHECK(bad == TSIZE, "new block %zu damaged at %zu", i, bad);
  }
  mt_stage_set(&tstage, 2);
  pthread_join(t, NULL);   /* the owner's heap becomes an orphan: our blocks in its old pages are ours */
  for (size_t i = 0; i < MINE; i++) M_free(mt_hide(mine[i]));
  printf("take: %llu pages given back or claimed, %zu of %d new blocks in them\n", (unsigned long long)got, inside, MINE);
  return mt_result("claim take");
}

/* ---- emptied ----
 * The owner fills 16 pages of 64-byte blocks (14 parked; the 15th, found dry by one refill only, waits at its class
 * list's tail; the 16th is its current page) and blocks; this thread frees every block. Each parked page goes back to
 * the arena as the batch with its last blocks is sent, before any thread allocates: 14 pages given back, none claimed,
 * the other two kept, and the bytes in pages in use down by 14 pages.
 * Run with background_thread:false: no sweep gives the pages back first. */
static int run_emptied(void) {
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, take_owner, NULL) == 0, "pthread_create");
  mt_stage_wait(&tstage, 1);
  enum { PAGES = TBLOCKS / 1024, PARKED = PAGES - 2 };
  REQUIRE(((uintptr_t)tblk[0] >> 16) != ((uintptr_t)tblk[TBLOCKS - 1] >> 16), "the owner's blocks are in one page");
  uint64_t e0 = emptied(), c0 = claimed();
  size_t active0 = mt_ctl_size("stats.active");
  for (size_t i = 0; i < TBLOCKS; i++) {
    size_t bad = mt_verify(tblk[i], TSIZE, i);
    CHECK(bad == TSIZE, "block %zu damaged at %zu", i, bad);
    M_free(mt_hide(tblk[i]));
  }
  mt_flush_outbox();
  uint64_t got = emptied() - e0;
  size_t active1 = mt_ctl_size("stats.active");
  printf("emptied: %llu pages given back, %llu claimed, active %zu -> %zu KiB\n", (unsigned long long)got,
         (unsigned long long)(claimed() - c0), active0 >> 10, active1 >> 10);
  CHECK(got == PARKED, "%llu pages given back by their last remote free, not the owner's %d parked ones",
        (unsigned long long)got, PARKED);
  CHECK(claimed() == c0, "a page was claimed, though no thread allocated");
  CHECK(active1 + (size_t)PARKED * 65536 <= active0, "stats.active fell by %zd bytes, not by %d pages",
        (ssize_t)(active0 - active1), PARKED);
  mt_stage_set(&tstage, 2);
  pthread_join(t, NULL);
  return mt_result("claim emptied");
}

/* ---- current ---- */
/* An owner's current page is never claimed, even with every block freed: its fast path allocates from it without the
 * lock. The owner fills exactly two pages (the first, found dry by one refill, at its class list's tail; the second
 * still its current one); another thread frees every block (the sends into the page that is not current flag the owner
 * for claims) and then allocates two pages' worth of the class: it claims the first page, never the current one, and
 * the owner's next blocks come from its own page. */
enum { CSIZE = 128, CPAGE = 512, CBLOCKS = 2 * CPAGE };   /* 512 blocks: one 64 KiB page */
static void *cblk[CBLOCKS];

static void *current_owner(void *arg) {
  (void)arg;
  alloc_filled(cblk, CBLOCKS, CSIZE, 0);
  mt_stage_set(&tstage, 1);
  mt_stage_wait(&tstage, 2);
  enum { AGAIN = 100 };
  void *again[AGAIN];
  size_t shared = 0;
  for (size_t i = 0; i < AGAIN; i++) {
    again[i] = M_malloc(CSIZE);
    REQUIRE(again[i], "malloc");
    shared += in_pages(tblk, CBLOCKS, again[i]);   /* tblk: the other thread's new blocks */
  }
  CHECK(shared == 0, "%zu of the owner's %d new blocks are in a page the other thread allocates from", shared, AGAIN);
  for (size_t i = 0; i < AGAIN; i++) M_free(mt_hide(again[i]));
  return NULL;
}

static int run_current(void) {
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, current_owner, NULL) == 0, "pthread_create");
  mt_stage_wait(&tstage, 1);
  REQUIRE(((uintptr_t)cblk[0] >> 16) != ((uintptr_t)cblk[CBLOCKS - 1] >> 16), "the owner's blocks are in one page");
  uint64_t before = taken();
  for (size_t i = 0; i < CBLOCKS; i++) {
    size_t bad = mt_verify(cblk[i], CSIZE, i);
    CHECK(bad == CSIZE, "block %zu damaged at %zu", i, bad);
    M_free(mt_hide(cblk[i]));
  }
  mt_flush_outbox();
  size_t in_current = 0;
  for (size_t i = 0; i < CBLOCKS; i++) {   /* tblk is free for this case: it holds our new blocks */
    tblk[i] = M_malloc(CSIZE);
    REQUIRE(tblk[i], "malloc");
    in_current += in_pages(cblk + CBLOCKS - 1, 1, tblk[i]);
  }
  CHECK(taken() == before + 1, "%llu pages left the owner, not its one page that is not current (the case tests nothing)",
        (unsigned long long)(taken() - before));
  CHECK(in_current == 0, "the owner's current page was claimed: %zu of our blocks are in it", in_current);
  mt_stage_set(&tstage, 2);
  pthread_join(t, NULL);
  for (size_t i = 0; i < CBLOCKS; i++) M_free(mt_hide(tblk[i]));
  return mt_result("claim current");
}

/* ---- orphan ---- */
/* An orphan's current page may be claimed: no thread allocates from it until one takes the orphan over. The owner
 * fills one page (its current one) and exits, its heap kept whole as an orphan (no purging thread: no sweep abandons
 * it); a thread that made its heap before (else it would take the orphan over) and has no page of the class (the C
 * library may have made one in the main thread) frees every block and allocates one of the class. */
static void *orphan_owner(void *arg) {
  (void)arg;
  alloc_filled(cblk, CPAGE, CSIZE, 0);
  return NULL;
}

static void *orphan_freer(void *arg) {
  (void)arg;
  void *mine = M_malloc(16);   /* this thread's heap, made before the orphan exists */
  REQUIRE(mine, "malloc");
  mt_stage_set(&tstage, 1);
  mt_stage_wait(&tstage, 2);   /* the owner has exited */
  uint64_t before = claimed();
  for (size_t i = 0; i < CPAGE; i++) {
    size_t bad = mt_verify(cblk[i], CSIZE, i);
    CHECK(bad == CSIZE, "block %zu damaged at %zu", i, bad);
    M_free(mt_hide(cblk[i]));
  }
  void *p = M_malloc(CSIZE);   /* this thread's first page of the class (its outbox is sent first) */
  REQUIRE(p, "malloc");
  CHECK(claimed() > before, "the orphan's emptied current page was not claimed");
  CHECK(in_pages(cblk, 1, p), "the new block is not in the orphan's emptied page");
  M_free(mt_hide(p));
  M_free(mine);
  return NULL;
}

static int run_orphan(void) {
  void *mine = M_malloc(16);   /* the main thread has a heap too: it would take the orphan over at its first free */
  REQUIRE(mine, "malloc");
  pthread_t f, t;
  REQUIRE(pthread_create(&f, NULL, orphan_freer, NULL) == 0, "pthread_create");
  mt_stage_wait(&tstage, 1);
  REQUIRE(pthread_create(&t, NULL, orphan_owner, NULL) == 0, "pthread_create");
  pthread_join(t, NULL);
  REQUIRE(((uintptr_t)cblk[0] >> 16) == ((uintptr_t)cblk[CPAGE - 1] >> 16), "the owner's blocks are not in one page");
  mt_stage_set(&tstage, 2);
  pthread_join(f, NULL);
  M_free(mine);
  return mt_result("claim orphan");
}

/* ---- outbox ---- */
/* A refill sends the thread's outbox before it looks for a page, so that a page whose last frees wait there can be
 * claimed at once: the owner fills a page of 48-byte blocks (1365: 21 batches of 64 and one of 21, which stays in
 * the freeing thread's outbox) and starts another; a new thread frees the first page's blocks and allocates one
 * block of the class, with no flush of its own. */
enum { OSIZE = 48, OPAGE = 1365, OBLOCKS = OPAGE + 10 };
static void *oblk[OBLOCKS];

static void *outbox_owner(void *arg) {
  (void)arg;
  for (size_t i = 0; i < OBLOCKS; i++) {
    oblk[i] = M_malloc(OSIZE);
    REQUIRE(oblk[i], "malloc");
  }
  mt_stage_set(&tstage, 1);
  mt_stage_wait(&tstage, 2);
  for (size_t i = OPAGE; i < OBLOCKS; i++) M_free(mt_hide(oblk[i]));
  return NULL;
}

/* In a thread of its own: its heap has no page of the class yet (the C library may have made one in the main thread). */
static void *outbox_freer(void *arg) {
  (void)arg;
  uint64_t before = taken();
  for (size_t i = 0; i < OPAGE; i++) M_free(mt_hide(oblk[i]));
  void *p = M_malloc(OSIZE);   /* this thread's first page of the class */
  REQUIRE(p, "malloc");
  CHECK(taken() > before, "the page whose last frees waited in this thread's outbox did not leave its owner");
  CHECK(in_pages(oblk, 1, p), "the new block is not in the owner's emptied page");
  M_free(mt_hide(p));
  return NULL;
}

static int run_outbox(void) {
  pthread_t t, f;
  REQUIRE(pthread_create(&t, NULL, outbox_owner, NULL) == 0, "pthread_create");
  mt_stage_wait(&tstage, 1);
  REQUIRE(((uintptr_t)oblk[0] >> 16) == ((uintptr_t)oblk[OPAGE - 1] >> 16) &&
          ((uintptr_t)oblk[0] >> 16) != ((uintptr_t)oblk[OPAGE] >> 16), "the owner's first page is not blocks 0-1364");
  REQUIRE(pthread_create(&f, NULL, outbox_freer, NULL) == 0, "pthread_create");
  pthread_join(f, NULL);
  mt_stage_set(&tstage, 2);
  pthread_join(t, NULL);
  return mt_result("claim outbox");
}

/* ---- race ---- */
/* Pairs of threads: an owner allocates a round's blocks (its pages park as they fill), then frees its even blocks of
 * 48 and 64 bytes itself (parked pages: the locked path, which puts them back on the class list) and churns other
 * sizes; its partner frees the rest remotely (all of the 128-byte blocks: those pages stay parked) and allocates as
 * it goes, claiming the owner's pages as they empty, while the other pair does the same. */
enum { PAIRS = 2, RBLOCKS = 12288, RROUNDS = 100 };
static const size_t rsizes[] = { 48, 64, 128 };
static void *rblk[PAIRS][RBLOCKS];
static pthread_barrier_t rbar;

static size_t rsize(size_t i) { return rsizes[i % 3]; }
static bool owner_frees(size_t i) { return i % 2 == 0 && rsize(i) != 128; }
static uint64_t rtag(uintptr_t pair, int round, size_t i) { return ((uint64_t)pair << 40) | ((uint64_t)round << 24) | i; }

static void *race_owner(void *arg) {
  uintptr_t p = (uintptr_t)arg;
  mt_rng_t rng;
  mt_rng_seed(&rng, p + 1);
  for (int r = 0; r < RROUNDS; r++) {
    for (size_t i = 0; i < RBLOCKS; i++) {
      rblk[p][i] = M_malloc(rsize(i));
      REQUIRE(rblk[p][i], "malloc");
      mt_fill(rblk[p][i], rsize(i), rtag(p, r, i));
    }
    pthread_barrier_wait(&rbar);   /* the round's blocks are ready */
    for (size_t i = 0; i < RBLOCKS; i++) {
      if (!owner_frees(i)) continue;
      size_t bad = mt_verify(rblk[p][i], rsize(i), rtag(p, r, i));
      CHECK(bad == rsize(i), "owner %zu round %d block %zu damaged at %zu", (size_t)p, r, i, bad);
      M_free(mt_hide(rblk[p][i]));
      if ((i & 254) == 0) {   /* busy meanwhile: refills of other classes */
        size_t n = 200 + mt_rng_below(&rng, 2000);
        void *q = M_malloc(n);
        REQUIRE(q, "malloc");
        mt_fill(q, n, i);
        CHECK(mt_verify(q, n, i) == n, "owner %zu churn block damaged", (size_t)p);
        M_free(mt_hide(q));
        /* A burst from the class whose pages the partner empties: from the owner's current page, which is never
         * claimed (the fast path allocates from it without the lock: both threads would pop the same list). */
        enum { BURST = 64 };
        void *bq[BURST];
        for (size_t k = 0; k < BURST; k++) {
          bq[k] = M_malloc(128);
          REQUIRE(bq[k], "malloc");
          mt_fill(bq[k], 128, (uint64_t)i << 8 | k);
        }
        sched_yield();
        for (size_t k = 0; k < BURST; k++) {
          CHECK(mt_verify(bq[k], 128, (uint64_t)i << 8 | k) == 128, "owner %zu burst block damaged", (size_t)p);
          M_free(mt_hide(bq[k]));
        }
      }
    }
    pthread_barrier_wait(&rbar);   /* both halves are back: the next round may reuse the array */
  }
  return NULL;
}

/* The partner keeps each round's new blocks until the end of the next round, so that every round needs new pages. */
static void *race_partner(void *arg) {
  uintptr_t p = (uintptr_t)arg;
  static void *mine[PAIRS][2][RBLOCKS];   /* [i]: the new block allocated as block i was freed */
  for (int r = 0; r <= RROUNDS; r++) {
    if (r < RROUNDS) {
      pthread_barrier_wait(&rbar);
      void **now = mine[p][r & 1];
      for (size_t i = 0; i < RBLOCKS; i++) {
        if (owner_frees(i)) continue;
        size_t bad = mt_verify(rblk[p][i], rsize(i), rtag(p, r, i));
        CHECK(bad == rsize(i), "partner %zu round %d block %zu damaged at %zu", (size_t)p, r, i, bad);
        M_free(mt_hide(rblk[p][i]));
        /* New blocks of the same classes as the frees go on: the owner's emptied pages are there to claim. */
        now[i] = M_malloc(rsize(i));
        REQUIRE(now[i], "malloc");
        mt_fill(now[i], rsize(i), rtag(p + PAIRS, r, i));
      }
      mt_flush_outbox();
    }
    if (r > 0) {   /* the previous round's */
      void **old = mine[p][(r - 1) & 1];
      for (size_t i = 0; i < RBLOCKS; i++) {
        if (owner_frees(i)) continue;
        size_t bad = mt_verify(old[i], rsize(i), rtag(p + PAIRS, r - 1, i));
        CHECK(bad == rsize(i), "partner %zu round %d new block %zu damaged at %zu", (size_t)p, r - 1, i, bad);
        M_free(mt_hide(old[i]));
      }
    }
    if (r < RROUNDS) pthread_barrier_wait(&rbar);
  }
  return NULL;
}

static int run_race(void) {
  uint64_t before = claimed(), before_e = emptied();
  REQUIRE(pthread_barrier_init(&rbar, NULL, 2 * PAIRS) == 0, "pthread_barrier_init");
  pthread_t o[PAIRS], q[PAIRS];
  for (uintptr_t i = 0; i < PAIRS; i++) {
    REQUIRE(pthread_create(&o[i], NULL, race_owner, (void *)i) == 0, "pthread_create");
    REQUIRE(pthread_create(&q[i], NULL, race_partner, (void *)i) == 0, "pthread_create");
  }
  for (int i = 0; i < PAIRS; i++) {
    pthread_join(o[i], NULL);
    pthread_join(q[i], NULL);
  }
  uint64_t got = claimed() - before, got_e = emptied() - before_e;
  printf("race: %llu pages claimed, %llu given back by their last remote free\n", (unsigned long long)got,
         (unsigned long long)got_e);
  CHECK(got + got_e > 0, "no page left its owner: the race was not exercised");
  return mt_result("claim race");
}

int main(int argc, char **argv) {
  const char *what = argc > 1 ? argv[1] : "take";
  if (!strcmp(what, "take")) return run_take();
  if (!strcmp(what, "emptied")) return run_emptied();
  if (!strcmp(what, "current")) return run_current();
  if (!strcmp(what, "orphan")) return run_orphan();
  if (!strcmp(what, "outbox")) return run_outbox();
  if (!strcmp(what, "race")) return run_race();
  fprintf(stderr, "usage: %s take|current|orphan|outbox|race\n", argv[0]);
  return 2;
}
