/* test_curpages.c — stats.classes.<c>.curpages counts the pages that heaps hold, whichever way a page leaves one: a
 * thread bound to an arena exits holding blocks (its pages are abandoned to the arena at once), another thread frees
 * them (the pages come back to the arena empty, by a reap), and the class's count is back where it started
 * (`abandon`; a page adopted meanwhile counts as held); the same with the owner alive and idle, its parked pages
 * handed over (`hand-over`). */
#include "mtest.h"
#include <pthread.h>
#include <unistd.h>

enum { N = 3000, SIZE = 3000 };   /* SIZE: a class nothing else here uses; N blocks: over a hundred pages */
static void *blk[N];
static unsigned cls;
static mt_stage_t stage = MT_STAGE_INIT;   /* 1: the owner's blocks are ready; 2: it may return */

static uint64_t cls_stat(const char *what) { return mt_class_stat(cls, what); }

static bool bound;   /* abandon: the owner binds itself to arena 0, so that its heap is abandoned when it exits */

static void *owner(void *arg) {
  (void)arg;
  if (bound) {
    unsigned idx = 0;
    REQUIRE(MT_CTL("thread.arena", NULL, NULL, &idx, sizeof idx) == 0, "thread.arena");
  }
  for (size_t i = 0; i < N; i++) {
    REQUIRE((blk[i] = M_malloc(SIZE)) != NULL, "malloc");
    mt_fill(blk[i], SIZE, i);
  }
  mt_stage_set(&stage, 1);
  if (!bound) mt_stage_wait(&stage, 2);   /* idle meanwhile: its parked pages may be handed over */
  return NULL;
}

/* Waits up to 3 s for the class's pages held to come down to `want`, collecting now and then. */
static uint64_t curpages_settled(uint64_t want) {
  double end = mt_now() + 3.0;
  uint64_t cur;
  while ((cur = cls_stat("curpages")) != want && mt_now() < end) {
    MT_COLLECT(true);   /* sweeps, reaps and purges now */
    usleep(2000);
  }
  return cur;
}

int main(int argc, char **argv) {
  REQUIRE(argc == 2 && (!strcmp(argv[1], "abandon") || !strcmp(argv[1], "hand-over")), "usage: %s abandon|hand-over",
          argv[0]);
  bound = !strcmp(argv[1], "abandon");
  cls = mt_class_of(SIZE);
  uint64_t before = cls_stat("curpages"), taken0 = cls_stat("npages");
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, owner, NULL) == 0, "pthread_create");
  mt_stage_wait(&stage, 1);
  if (bound) pthread_join(t, NULL);   /* its heap abandoned: every page still holds blocks */
  uint64_t taken = cls_stat("npages") - taken0;
  REQUIRE(taken >= 10, "the owner took %llu pages of class %u", (unsigned long long)taken, cls);
  void *mine = NULL;
  if (bound) {   /* a page of the class for this thread: one of the abandoned ones, adopted (counted taken again) */
    uint64_t held = cls_stat("curpages");
    REQUIRE((mine = M_malloc(SIZE)) != NULL, "malloc");
    /* It adopts abandoned pages until one has room, parking the full ones: 1 to all of them, held now. */
    uint64_t now = cls_stat("curpages");
    CHECK(now >= held + 1 && now <= held + taken, "abandon: %llu pages held after this thread adopted pages, %llu before",
          (unsigned long long)now, (unsigned long long)held);
  }
  uint64_t handed0 = mt_ctl_u64("stats.pages_handed_over");
  for (size_t k = 0; k < 2; k++) {   /* every other block, then the rest */
    for (size_t i = k; i < N; i += 2) {
      size_t bad = mt_verify(blk[i], SIZE, i);
      CHECK(bad == SIZE, "block %zu damaged at %zu", i, bad);
      M_free(mt_hide(blk[i]));
    }
    mt_flush_outbox();
    /* hand-over: the idle owner's parked pages, half free, go to the arena still holding its blocks (heap.c
     * hand_over), asked for by the sends into them and done by the purging thread's sweep within a few ms. */
    double end = mt_now() + 2.0;
    while (!bound && k == 0 && mt_ctl_u64("stats.pages_handed_over") == handed0 && mt_now() < end) {
      M_free(mt_hide(M_malloc(16 << 20)));   /* past 8 MiB mapped, a slow path starts the purging thread */
      usleep(1000);
    }
    if (!bound && k == 0)
      REQUIRE(mt_ctl_u64("stats.pages_handed_over") > handed0, "no page of the idle owner was handed over");
  }
  M_free(mt_hide(mine));
  if (!bound) {
    mt_stage_set(&stage, 2);
    pthread_join(t, NULL);   /* its heap an orphan, abandoned by the collection below */
  }
  uint64_t cur = curpages_settled(before);
  CHECK(cur == before, "%s: class %u held %llu pages before the owner took %llu; every block freed, it holds %llu",
        argv[1], cls, (unsigned long long)before, (unsigned long long)taken, (unsigned long long)cur);
  printf("%s: class %u: %llu pages taken, %llu held before, %llu after\n", argv[1], cls, (unsigned long long)taken,
         (unsigned long long)before, (unsigned long long)cur);
  return mt_result(argv[1]);
}
