/* test_decay_adapt.c — the decay lengthens while purged memory is faulted in again soon after, and only then:
 *   lengthen   dirty_decay_ms:100,dirty_decay_max_ms:4000: 8 MiB freed, purged, allocated again 300 ms later: the
 *              decay in force (stats.dirty_decay_ms) is the maximum, not a fit of that gap; freed again, the memory
 *              outlives a pause 4 times that gap (a fitted decay, 1.5 times it, would have purged it), is still
 *              purged once the lengthened decay has passed, and the decay goes back to 100 ms after 4 of its
 *              lengths without use;
 *   pinned     dirty_decay_ms:100 alone: the decay is as given (the maximum follows it), the same refault changes
 *              nothing and the memory freed again is purged within the base decay;
 *   forced     the same program, but purged by mallard_collect(true) instead of by age: no lengthening;
 *   resident   a dirty span freed beside a purged one stays apart: stats.dirty counts resident memory only;
 *   moved      narenas:2: the memory is purged and unmapped in arena 0 and faulted in again by the same thread, now
 *              in arena 1 (threads move between automatic arenas under contention): a refault all the same.
 * Large blocks (1 MiB: arena spans), the purging thread on (the default). */
#include "mtest.h"
#include <stdbool.h>

#define MiB ((size_t)1024 * 1024)
#define NBLK 8

static void *blk[NBLK];

static long decay_now(void) { return mt_ctl_long("stats.dirty_decay_ms"); }

static void alloc_all(uint64_t tag) {
  for (int i = 0; i < NBLK; i++) {
    blk[i] = M_malloc(MiB);
    REQUIRE(blk[i], "malloc(1 MiB)");
    mt_fill(blk[i], MiB, tag + (uint64_t)i);   /* resident, through an opaque fill */
  }
}

static void free_all(void) {
  for (int i = 0; i < NBLK; i++) M_free(blk[i]);
}

/* Wait until at most `limit` bytes are dirty; returns the seconds waited (or -1 after `secs`). */
static double wait_dirty_below(size_t limit, double secs) {
  double t0 = mt_now();
  while (mt_ctl_size("stats.dirty") > limit) {
    if (mt_now() - t0 > secs) return -1;
    usleep(10 * 1000);
  }
  return mt_now() - t0;
}

/* Free, purged by age (or by mallard_collect when `force`), a pause of `gap_ms`, then allocated again. */
static void refault(unsigned gap_ms, bool force) {
  alloc_all(1);
  free_all();
  if (force) MT_COLLECT(true);
  REQUIRE(wait_dirty_below(MiB, 5.0) >= 0, "8 MiB freed were not purged within 5 s");
  usleep(gap_ms * 1000);
  alloc_all(100);
}

static void case_lengthen(void) {
  CHECK(mt_ctl_long("opt.dirty_decay_ms") == 100 && mt_ctl_long("opt.dirty_decay_max_ms") == 4000, "options");
  CHECK(decay_now() == 100, "decay before any refault: %ld", decay_now());
  refault(300, false);
  double t_reuse = mt_now();
  long d = decay_now();
  printf("lengthen: decay after a refault 300 ms after the purge: %ld ms\n", d);
  /* The gap was the purge age (~88 ms) plus 300 ms, which the maximum covers (up to 2.67 s: slack for a slow
   * machine): the decay is the maximum. */
  CHECK(d == 4000, "decay %ld ms after a refault 300 ms after its purge (want the maximum, 4000)", d);
  free_all();
  usleep(1200 * 1000);   /* a pause 4 times the one that refaulted: purged by now under 1.5 times that gap */
  size_t dirty = mt_ctl_size("stats.dirty");
  CHECK(dirty >= NBLK * MiB, "only %zu bytes dirty 1.2 s after freeing 8 MiB under a %ld ms decay", dirty, d);
  double w = wait_dirty_below(MiB, (double)d / 1000.0 + 5.0);
  printf("lengthen: purged %.2f s after the 1.2 s check\n", w);
  CHECK(w >= 0, "memory freed under the lengthened decay not purged within it and 5 s");
  /* Not reused since t_reuse: the lengthening lasts 4 of its lengths, then the decay is the base again. */
  double held = mt_now() - t_reuse;
  if (held < 3.5 * (double)d / 1000.0) CHECK(decay_now() == d, "decay %ld, not %ld, %.2f s after", decay_now(), d, held);
  double t0 = mt_now();
  while (decay_now() != 100 && mt_now() - t0 < 4.0 * (double)d / 1000.0 + 3.0) usleep(50 * 1000);
  printf("lengthen: back to %ld ms %.2f s after the last reuse\n", decay_now(), mt_now() - t_reuse);
  CHECK(decay_now() == 100, "decay still %ld ms %.2f s after the last reuse", decay_now(), mt_now() - t_reuse);
}

static void bind_arena(unsigned i) {
  REQUIRE(MT_CTL("thread.arena", NULL, NULL, &i, sizeof i) == 0, "thread.arena = %u", i);
}

static void case_moved(void) {
  CHECK(mt_ctl_long("opt.dirty_decay_max_ms") == 6000, "options");
  bind_arena(0);
  alloc_all(1);
  free_all();
  REQUIRE(wait_dirty_below(MiB, 5.0) >= 0, "8 MiB freed were not purged within 5 s");
  usleep(1000 * 1000);
  bind_arena(1);   /* no free span there: new segments, while arena 0's were unmapped by age */
  alloc_all(100);
  long d = decay_now();
  printf("moved: decay after a refault in another arena 1 s after the purge: %ld ms\n", d);
  /* A gap of ~1.1 s, which the maximum covers up to 4 s. */
  CHECK(d == 6000, "decay %ld ms after a refault in another arena (want the maximum, 6000)", d);
  free_all();
}

static void case_pinned(void) {
  CHECK(mt_ctl_long("opt.dirty_decay_ms") == 100 && mt_ctl_long("opt.dirty_decay_max_ms") == 100,
        "a given dirty_decay_ms without a maximum: maximum %ld", mt_ctl_long("opt.dirty_decay_max_ms"));
  refault(1000, false);
  CHECK(decay_now() == 100, "pinned decay lengthened to %ld ms", decay_now());
  free_all();
  double w = wait_dirty_below(MiB, 5.0);
  printf("pinned: purged %.2f s after the free\n", w);
  CHECK(w >= 0 && w < 2.0, "memory not purged within 2 s of a 100 ms decay (%.2f)", w);
}

static void case_forced(void) {
  refault(1000, true);
  CHECK(decay_now() == 100, "a refault after mallard_collect lengthened the decay to %ld ms", decay_now());
  free_all();
}

static void case_resident(void) {
  alloc_all(3);   /* kept: 8 MiB mapped start the purging thread (background.c BG_START_BYTES) */
  void *a = M_malloc(MiB), *b = M_malloc(MiB);
  REQUIRE(a && b, "malloc");
  mt_fill(a, MiB, 7);
  mt_fill(b, MiB, 8);
  M_free(a);
  size_t d1 = mt_ctl_size("stats.dirty");   /* pages kept by the thread's page cache count as dirty too */
  REQUIRE(d1 >= MiB, "%zu bytes dirty after freeing 1 MiB", d1);
  REQUIRE(wait_dirty_below(d1 - MiB, 5.0) >= 0, "1 MiB freed not purged within 5 s");
  size_t d2 = mt_ctl_size("stats.dirty");
  M_free(b);   /* beside a's purged span, or the segment's untouched rest: neither may join it */
  size_t d3 = mt_ctl_size("stats.dirty");
  printf("resident: dirty %zu -> %zu bytes after freeing 1 MiB beside purged memory\n", d2, d3);
  CHECK(d3 >= d2 + MiB && d3 <= d2 + MiB + MiB / 4, "dirty grew by %zd bytes for 1 MiB freed", (ssize_t)(d3 - d2));
  free_all();
}

int main(int argc, char **argv) {
  REQUIRE(argc == 2, "usage: %s lengthen|pinned|forced|resident|moved", argv[0]);
  if (!strcmp(argv[1], "lengthen")) case_lengthen();
  else if (!strcmp(argv[1], "pinned")) case_pinned();
  else if (!strcmp(argv[1], "forced")) case_forced();
  else if (!strcmp(argv[1], "resident")) case_resident();
  else if (!strcmp(argv[1], "moved")) case_moved();
  else REQUIRE(0, "unknown case %s", argv[1]);
  return mt_result(argv[1]);
}
