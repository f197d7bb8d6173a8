/* test_take_idle.c — a thread that needs a page takes pages of an idle live thread that still holds blocks of them
 * (heap.c take_from_idle: parked from outside, a barrier on every thread, the owner's hazard respected): `take` checks
 * that it happens while the owner is blocked, that the new blocks come from its pages and that every block stays
 * intact, the owner's own later frees into the taken pages included; `race` has owners that, after making their
 * blocks, never refill (so they look idle) while they free their own blocks one by one, and takers that free the rest
 * of the owners' blocks and allocate, taking those pages meanwhile. Every block carries a pattern checked before it is
 * freed. `race` is built for ThreadSanitizer and the race-delay build too, whose pause inside the owner's push (one
 * push in 4 here: MALLARD_RACE_FREE_PERIOD) is where an owner's free meets a take, and which aborts when the page
 * stopped being the owner's before the push ended. */
#include "mtest.h"
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

static uint64_t taken(void) { return mt_ctl_u64("stats.pages_taken_idle"); }


static bool in_pages(void *const *blocks, size_t n, size_t step, const void *p) {   /* small pages: one 64 KiB slot */
  for (size_t i = 0; i < n; i += step)
    if (((uintptr_t)blocks[i] >> 16) == ((uintptr_t)p >> 16)) return true;
  return false;
}

/* ---- take ---- */
enum { TBLOCKS = 16384, TSIZE = 64, TNEW = 4096 };   /* 16 pages of 1024 blocks */
static void *tblk[TBLOCKS];
static mt_stage_t tstage = MT_STAGE_INIT;   /* 1: the owner's blocks are ready; 2: the owner may free its own */

static bool owner_keeps(size_t i) { return i % 4 == 0; }   /* the owner frees these itself, at the end */
static bool main_frees(size_t i) { return i % 4 == 1; }    /* a quarter of every page, freed by main before it allocates */

static void *take_owner(void *arg) {
  (void)arg;
  for (size_t i = 0; i < TBLOCKS; i++) {
    tblk[i] = M_malloc(TSIZE);
    REQUIRE(tblk[i], "malloc");
    mt_fill(tblk[i], TSIZE, i);
  }
  /* One block of each page back from its owner: pages it found full come back to its class list (as larson's main
   * thread leaves them after its warm-up), where only a take can reach them while it holds blocks of them. */
  for (size_t i = 3; i < TBLOCKS; i += 1024) {
    CHECK(mt_verify(tblk[i], TSIZE, i) == TSIZE, "owner's block %zu damaged", i);
    M_free(mt_hide(tblk[i]));
    tblk[i] = NULL;
  }
  mt_stage_set(&tstage, 1);
  mt_stage_wait(&tstage, 2);   /* blocked: its pages hold its blocks, it refills no more */
  for (size_t i = 0; i < TBLOCKS; i++) {
    if (!owner_keeps(i)) continue;
    size_t bad = mt_verify(tblk[i], TSIZE, i);
    CHECK(bad == TSIZE, "owner's block %zu damaged at %zu", i, bad);
    M_free(mt_hide(tblk[i]));   /* into pages now another thread's: remote frees */
  }
  return NULL;
}

static int run_take(void) {
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, take_owner, NULL) == 0, "pthread_create");
  mt_stage_wait(&tstage, 1);
  uint64_t before = taken();
  for (size_t i = 0; i < TBLOCKS; i++) {
    if (!main_frees(i) || !tblk[i]) continue;
    CHECK(mt_verify(tblk[i], TSIZE, i) == TSIZE, "block %zu damaged", i);
    M_free(mt_hide(tblk[i]));
  }
  mt_flush_outbox();   /* published: a take counts them */
  usleep(20 * 1000);   /* past the idle time since the owner's last refill */
  static void *mine[TNEW];
  size_t in_owner = 0;
  for (size_t i = 0; i < TNEW; i++) {
    mine[i] = M_malloc(TSIZE);
    REQUIRE(mine[i], "malloc");
    mt_fill(mine[i], TSIZE, TBLOCKS + i);
    in_owner += in_pages(tblk, TBLOCKS, 1024, mine[i]);
  }
  uint64_t got = taken() - before;
  printf("take: %llu pages taken, %zu of %d new blocks in the owner's pages\n", (unsigned long long)got, in_owner,
         (int)TNEW);
  CHECK(got > 0, "no page of the idle owner was taken");
  CHECK(in_owner >= TNEW / 2, "only %zu of %d new blocks came from the owner's pages", in_owner, (int)TNEW);
  /* Everyone's blocks intact; then the owner frees its own into pages that are ours now. */
  for (size_t i = 0; i < TBLOCKS; i++)
    if (i % 4 >= 2 && tblk[i]) CHECK(mt_verify(tblk[i], TSIZE, i) == TSIZE, "owner's block %zu damaged after the take", i);
  mt_stage_set(&tstage, 2);
  pthread_join(t, NULL);
  for (size_t i = 0; i < TBLOCKS; i++) {
    if (i % 4 < 2 || !tblk[i]) continue;
    CHECK(mt_verify(tblk[i], TSIZE, i) == TSIZE, "block %zu damaged", i);
    M_free(mt_hide(tblk[i]));
  }
  for (size_t i = 0; i < TNEW; i++) {
    size_t bad = mt_verify(mine[i], TSIZE, TBLOCKS + i);
    CHECK(bad == TSIZE, "new block %zu damaged at %zu", i, bad);
    M_free(mt_hide(mine[i]));
  }
  return mt_result("take_idle take");
}

/* ---- race ---- */
enum { OWNERS = 2, TAKERS = 2, RBLOCKS = 24576, RNEW = 12288, ITERS = 5 };
static void *rblk[OWNERS][RBLOCKS];
static pthread_barrier_t rbar;        /* every owner's blocks are made, with room in every page */

static size_t rsize(size_t i) { return 32 + 16 * (i % 3); }   /* three classes */
static uint64_t rtag(size_t o, size_t i) { return (uint64_t)o << 32 | i; }
static bool owner_own(size_t i) { return i % 2 == 0; }   /* freed by the owner; the rest by takers */

/* An owner makes its blocks, frees an eighth of them (every page back on its class list, with room), then, idle from
 * then on (it never refills), frees the rest of its own one by one while takers take its pages. */
static void *race_owner(void *arg) {
  size_t o = (size_t)(uintptr_t)arg;
  for (size_t i = 0; i < RBLOCKS; i++) {
    rblk[o][i] = M_malloc(rsize(i));
    REQUIRE(rblk[o][i], "malloc");
    mt_fill(rblk[o][i], rsize(i), rtag(o, i));
  }
  for (size_t i = 0; i < RBLOCKS; i += 8) {   /* i % 8 == 0: even, every class */
    M_free(mt_hide(rblk[o][i]));
    rblk[o][i] = NULL;
  }
  pthread_barrier_wait(&rbar);
  uint64_t rng = 0x9E3779B97F4A7C15ull * (o + 1);
  for (size_t k = 0; k < 4 * RBLOCKS; k++) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    size_t i = ((size_t)(rng >> 33) % RBLOCKS) & ~(size_t)1;   /* an even index: the owner's */
    if (k % 32 == 0) sched_yield();
    if (!rblk[o][i]) continue;
    size_t bad = mt_verify(rblk[o][i], rsize(i), rtag(o, i));
    CHECK(bad == rsize(i), "owner %zu block %zu damaged at %zu", o, i, bad);
    M_free(mt_hide(rblk[o][i]));
    rblk[o][i] = NULL;
  }
  for (size_t i = 0; i < RBLOCKS; i += 2)
    if (rblk[o][i]) {
      CHECK(mt_verify(rblk[o][i], rsize(i), rtag(o, i)) == rsize(i), "owner %zu block %zu damaged", o, i);
      M_free(mt_hide(rblk[o][i]));
      rblk[o][i] = NULL;
    }
  return NULL;
}

/* A taker waits past the owners' idle time, then makes new blocks of their classes, all kept to the end (it needs
 * pages all along), freeing its share of the owners' other blocks (odd indices, i / 2 % TAKERS == its number) as it
 * goes. */
static void *race_taker(void *arg) {
  size_t t = (size_t)(uintptr_t)arg;
  static void *mine[TAKERS][RNEW];
  size_t cursor = 0, share = 0;
  pthread_barrier_wait(&rbar);
  usleep(2500);
  for (size_t n = 0; n < RNEW; n++) {
    mine[t][n] = M_malloc(rsize(n));
    REQUIRE(mine[t][n], "malloc");
    mt_fill(mine[t][n], rsize(n), (uint64_t)(t + 100) << 48 | n);
    for (int k = 0; k < 2 && cursor < (size_t)OWNERS * RBLOCKS; cursor++) {
      size_t o = cursor % OWNERS, i = cursor / OWNERS;
      if (owner_own(i) || i / 2 % TAKERS != t) continue;
      size_t bad = mt_verify(rblk[o][i], rsize(i), rtag(o, i));
      CHECK(bad == rsize(i), "taker %zu: owner %zu block %zu damaged at %zu", t, o, i, bad);
      M_free(mt_hide(rblk[o][i]));
      k++;
      share++;
    }
    if (n % 64 == 0) mt_flush_outbox();
  }
  for (; cursor < (size_t)OWNERS * RBLOCKS; cursor++) {
    size_t o = cursor % OWNERS, i = cursor / OWNERS;
    if (owner_own(i) || i / 2 % TAKERS != t) continue;
    CHECK(mt_verify(rblk[o][i], rsize(i), rtag(o, i)) == rsize(i), "taker %zu: owner %zu block %zu damaged", t, o, i);
    M_free(mt_hide(rblk[o][i]));
  }
  for (size_t n = 0; n < RNEW; n++) {
    size_t bad = mt_verify(mine[t][n], rsize(n), (uint64_t)(t + 100) << 48 | n);
    CHECK(bad == rsize(n), "taker %zu block %zu damaged at %zu", t, n, bad);
    M_free(mt_hide(mine[t][n]));
  }
  return NULL;
}

static int run_race(void) {
  uint64_t before = taken();
  REQUIRE(pthread_barrier_init(&rbar, NULL, OWNERS + TAKERS) == 0, "pthread_barrier_init");
  for (int it = 0; it < ITERS; it++) {
    pthread_t ow[OWNERS], tk[TAKERS];
    for (size_t o = 0; o < OWNERS; o++) REQUIRE(pthread_create(&ow[o], NULL, race_owner, (void *)(uintptr_t)o) == 0, "pthread_create");
    for (size_t t = 0; t < TAKERS; t++) REQUIRE(pthread_create(&tk[t], NULL, race_taker, (void *)(uintptr_t)t) == 0, "pthread_create");
    for (size_t o = 0; o < OWNERS; o++) pthread_join(ow[o], NULL);
    for (size_t t = 0; t < TAKERS; t++) pthread_join(tk[t], NULL);
  }
  printf("race: %llu pages taken\n", (unsigned long long)(taken() - before));
  return mt_result("take_idle race");
}

int main(int argc, char **argv) {
  const char *what = argc > 1 ? argv[1] : "take";
  if (!strcmp(what, "take")) return run_take();
  if (!strcmp(what, "race")) return run_race();
  fprintf(stderr, "unknown case %s\n", what);
  return 2;
}
