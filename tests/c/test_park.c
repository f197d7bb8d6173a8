/* test_park.c — parking, counted (heap.c heap_find_page, mld_free_parked): a page a refill finds with nothing free
 * moves to its class list's tail (not parked: its owner's frees into it stay on the fast path) and is parked
 * (stats.pages_parked) when a later refill finds it so again; the owner's free into a parked page takes the locked
 * path (stats.frees_parked). A block freed into a page that ran dry is handed out again before a new page is taken.
 * In a thread of its own: its heap allocates nothing else of the class. */
#include "mtest.h"
#include <pthread.h>

enum { SIZE = 64, MAXB = 1 << 16 };
static void *blk[MAXB];

static uintptr_t page_id(const void *p) { return (uintptr_t)p >> 16; }   /* small pages are one 64 KiB slot */
static uint64_t parked(void) { return mt_ctl_u64("stats.pages_parked"); }
static uint64_t frees_parked(void) { return mt_ctl_u64("stats.frees_parked"); }

/* Allocates into blk from *n on until a block lands in a page none of `pages` names; returns that block's index. */
static size_t fill_until_new(size_t *n, const uintptr_t *pages, size_t npages) {
  for (;;) {
    REQUIRE(*n < MAXB, "no new page after %d blocks", MAXB);
    void *p = M_malloc(SIZE);
    REQUIRE(p, "malloc");
    blk[(*n)++] = p;
    bool known = false;
    for (size_t i = 0; i < npages; i++) known |= page_id(p) == pages[i];
    if (!known) return *n - 1;
  }
}

static void *run(void *arg) {
  (void)arg;
  size_t n = 0;
  blk[n++] = M_malloc(SIZE);
  REQUIRE(blk[0], "malloc");
  uintptr_t pages[2] = { page_id(blk[0]) };
  uint64_t p0 = parked(), f0 = frees_parked();
  /* Page A filled: the refill that found it dry moved it to the class list's tail and took page B. */
  size_t b0 = fill_until_new(&n, pages, 1);
  pages[1] = page_id(blk[b0]);
  CHECK(parked() == p0, "%llu pages parked when page A first ran dry (0 expected)", (unsigned long long)(parked() - p0));
  /* The owner frees a block of A: A is not parked, the fast path. */
  void *a0 = blk[0];
  M_free(mt_hide(a0));
  CHECK(frees_parked() == f0, "%llu locked frees after a free into page A, not parked (0 expected)",
        (unsigned long long)(frees_parked() - f0));
  /* B filled: its refill moves B to the tail and takes A back (one free block); A runs dry at once, and the next
   * refill moves A and parks B (found dry a second time); C follows. */
  size_t c0 = fill_until_new(&n, pages, 2);
  bool reused = false;
  for (size_t i = b0; i < c0; i++) reused |= blk[i] == a0;
  CHECK(reused, "the block freed into page A was not handed out again before a new page");
  CHECK(parked() == p0 + 1, "%llu pages parked by the time page C was taken (1 expected: B)",
        (unsigned long long)(parked() - p0));
  /* The owner frees a block of B, parked: the locked path. */
  M_free(mt_hide(blk[b0]));
  CHECK(frees_parked() == f0 + 1, "%llu locked frees after a free into the parked page B (1 expected)",
        (unsigned long long)(frees_parked() - f0));
  for (size_t i = 1; i < n; i++)   /* blk[0] and blk[b0] are freed (a0 may be live again, further on) */
    if (i != b0) M_free(mt_hide(blk[i]));
  return NULL;
}

int main(void) {
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, run, NULL) == 0, "pthread_create");
  pthread_join(t, NULL);
  return mt_result("park");
}
