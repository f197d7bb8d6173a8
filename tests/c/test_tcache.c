/* test_tcache.c — the fast variant's thread cache (heap.c bcache_*, option tcache): `lifo` checks that an owner's frees
 * come back last-freed-first, ahead of the current page, up to the class's limit, in every class up to 1 KiB (64
 * blocks up to 512 B, 32 KiB's worth above: 32 of 1 KiB); `poison` that a write into a cached block, after its free,
 * does not steer the next mallocs (the cache keeps its pointers outside the blocks); `flush` that thread.tcache.flush gives cached blocks back to their pages, so that an emptied page leaves; `exit`
 * that a thread's cached blocks go back to its pages when it exits (counted freed once), so that the thread taking its
 * heap over can give those pages back. Each part runs in threads of its own: their heaps allocate nothing else of the
 * classes used. */
#include "mtest.h"
#include <pthread.h>

enum { NMAX = 8192 };   /* a 64 KiB page of 16 B blocks and one more */
static void *blk[NMAX];

static uintptr_t page_id(const void *p) { return (uintptr_t)p >> 16; }   /* small pages are one 64 KiB slot */

/* Allocates `size` blocks into blk until one lands in a page other than blk[0]'s; returns how many were made. */
static size_t fill_first_page(size_t size) {
  size_t n = 0;
  for (;;) {
    REQUIRE(n < NMAX, "no second page after %d blocks", NMAX);
    blk[n] = M_malloc(size);
    REQUIRE(blk[n], "malloc");
    if (n++ && page_id(blk[n - 1]) != page_id(blk[0])) return n;
  }
}

/* ---- lifo ---- */
/* n blocks of the first page freed (k of them), then allocated again: the cached ones come back in the reverse order
 * of their frees, before any block of the current (second) page; the rest went to the first page, which is not
 * current, so the allocations past the limit come from the second page. */
static void lifo_class(size_t size, size_t limit) {
  size_t n = fill_first_page(size);
  size_t k = limit + 8;
  REQUIRE(n - 1 >= k, "only %zu blocks in the first page", n - 1);
  /* One block of the first page, freed and asked for again: the cache hands it back (a page's list would not: the
   * second page is current). */
  void *x = blk[0];
  M_free(mt_hide(x));
  void *y = M_malloc(size);
  CHECK(y == x, "size %zu: the block freed last was not handed out next (%p, then %p)", size, x, y);
  blk[0] = y;
  for (size_t i = 0; i < k; i++) M_free(mt_hide(blk[i]));
  void *got[NMAX];
  size_t lifo = 0;
  for (size_t i = 0; i < k; i++) {
    got[i] = M_malloc(size);
    REQUIRE(got[i], "malloc");
    if (i < limit && got[i] == blk[limit - 1 - i]) lifo++;
  }
  CHECK(lifo == limit, "size %zu: %zu of %zu allocations were the cached blocks in reverse order of their frees", size,
        lifo, limit);
  size_t past = 0;
  for (size_t i = limit; i < k; i++) past += page_id(got[i]) == page_id(blk[n - 1]);
  CHECK(past == k - limit, "size %zu: %zu of the %zu allocations past the cache's limit came from the current page", size,
        past, k - limit);
  for (size_t i = 0; i < k; i++) M_free(mt_hide(got[i]));
  for (size_t i = k; i < n; i++) M_free(mt_hide(blk[i]));
}

/* Every class up to 1 KiB: 16-128 B in steps of 16, then four a doubling. The heap lays their stacks out one after
 * the other in a fixed array: one too short would cut the last classes' limits. */
static void *lifo_run(void *arg) {
  (void)arg;
  static const size_t sizes[] = { 16, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256,
                                  320, 384, 448, 512, 640, 768, 896, 1000 };
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    size_t limit = 32768 / (sizes[i] <= 512 ? 512 : sizes[i] == 1000 ? 1024 : sizes[i]);   /* 64 blocks, or 32 KiB */
    lifo_class(sizes[i], limit);
  }
  return NULL;
}

/* ---- poison ---- */
/* Two blocks freed into the cache, then the one freed last overwritten through a stale pointer with the address of a
 * decoy (where a cache linked through its blocks keeps its next pointer): the next two mallocs still hand out the two
 * blocks, and never the decoy. */
static char decoy[256] __attribute__((aligned(64)));
static __attribute__((noinline)) void scribble(void *p, size_t n) {
  void **w = mt_hide(p);
  for (size_t i = 0; i < n / sizeof(void *); i++) w[i] = decoy;
}
static void *poison_run(void *arg) {
  (void)arg;
  for (size_t size = 16; size <= 1024; size *= 2) {
    void *a = M_malloc(size), *b = M_malloc(size);
    REQUIRE(a && b, "malloc");
    M_free(mt_hide(b));
    M_free(mt_hide(a));
    scribble(a, size);   /* a use after free, on purpose */
    void *x = M_malloc(size), *y = M_malloc(size);
    CHECK(x == a && y == b, "size %zu: after a write into a freed cached block, malloc gave %p and %p (%p and %p "
          "expected; the decoy is %p)", size, x, y, a, b, (void *)decoy);
    if (x != (void *)decoy) M_free(mt_hide(x));
    if (y != (void *)decoy) M_free(mt_hide(y));
  }
  return NULL;
}

/* ---- flush ---- */
/* Every block of the first page freed: 32 of them (class 1,024 B) wait in the cache, counted in the page's `used`, so
 * the page stays; thread.tcache.flush gives them back, the page empties and leaves (page_cache:0: to its arena). */
static void *flush_run(void *arg) {
  (void)arg;
  size_t n = fill_first_page(1000);
  uint64_t before = mt_ctl_u64("stats.active");
  for (size_t i = 0; i + 1 < n; i++) M_free(mt_hide(blk[i]));
  uint64_t freed = mt_ctl_u64("stats.active");
  CHECK(freed == before, "stats.active %llu -> %llu with the first page's blocks cached (unchanged expected)",
        (unsigned long long)before, (unsigned long long)freed);
  REQUIRE(MT_CTL("thread.tcache.flush", NULL, NULL, NULL, 0) == 0, "thread.tcache.flush");
  uint64_t flushed = mt_ctl_u64("stats.active");
  CHECK(flushed + 65536 <= before, "stats.active %llu -> %llu after thread.tcache.flush (the emptied page should leave)",
        (unsigned long long)before, (unsigned long long)flushed);
  M_free(mt_hide(blk[n - 1]));
  return NULL;
}

/* ---- exit ---- */
/* A thread frees 16 pages' worth of blocks (the first 32 into its cache) and exits; the next thread takes its heap
 * over (the most recent orphan) and collects: every page is empty, so stats.active comes back to where it was. Had
 * the exiting thread's cached blocks been dropped rather than given back, their page would stay. */
static void *exit_free_all(void *arg) {
  (void)arg;
  for (size_t i = 0; i < 1024; i++) {
    blk[i] = M_malloc(1000);
    REQUIRE(blk[i], "malloc");
  }
  for (size_t i = 0; i < 1024; i++) M_free(mt_hide(blk[i]));
  return NULL;
}
static void *exit_collect(void *arg) {
  (void)arg;
  void *p = M_malloc(1000);   /* takes the most recent orphan over, and caches a block that the collection gives back */
  REQUIRE(p, "malloc");
  M_free(mt_hide(p));
  MT_COLLECT(true);
  return NULL;
}

static void run_thread(void *(*fn)(void *)) {
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, fn, NULL) == 0, "pthread_create");
  pthread_join(t, NULL);
}

int main(int argc, char **argv) {
  const char *part = argc > 1 ? argv[1] : "lifo";
  if (!strcmp(part, "lifo")) {
    run_thread(lifo_run);
  } else if (!strcmp(part, "poison")) {
    run_thread(poison_run);
  } else if (!strcmp(part, "flush")) {
    run_thread(flush_run);
  } else if (!strcmp(part, "exit")) {
    run_thread(exit_collect);   /* whatever creating a thread allocates in this one (static, preload) is there now */
    unsigned cls = mt_class_of(1000);
    uint64_t before = mt_ctl_u64("stats.active"), live_before = mt_class_stat(cls, "curobjs");
    uint64_t freed_before = mt_class_stat(cls, "nfree");
    run_thread(exit_free_all);
    /* Each free counted once: into the cache, and not again when the exit gives the block back to its page. */
    uint64_t freed = mt_class_stat(cls, "nfree") - freed_before, live = mt_class_stat(cls, "curobjs");
    CHECK(freed == 1024 && live == live_before, "class %u after the exiting thread's 1024 frees: nfree +%llu, curobjs "
          "%llu -> %llu", cls, (unsigned long long)freed, (unsigned long long)live_before, (unsigned long long)live);
    run_thread(exit_collect);
    uint64_t after = mt_ctl_u64("stats.active");
    CHECK(after < before + 65536, "stats.active %llu -> %llu after the thread that took the heap over collected",
          (unsigned long long)before, (unsigned long long)after);
  } else {
    REQUIRE(0, "unknown part %s", part);
  }
  return mt_result(part);
}
