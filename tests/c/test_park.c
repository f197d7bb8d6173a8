/* test_park.c — parking, counted (heap.c heap_find_page, mld_free_parked): a page a refill finds with nothing free is
 * parked at once (stats.pages_parked), and its owner's free into it takes the locked path (stats.frees_parked), which
 * puts it back on its class list, so that the block freed into it is handed out again before a new page is taken. In a
 * thread of its own: its heap allocates nothing else of the class. */
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
  /* Page A filled: the refill that found it dry parked it and took page B. */
  size_t b0 = fill_until_new(&n, pages, 1);
  pages[1] = page_id(blk[b0]);
  CHECK(parked() == p0 + 1, "%llu pages parked when page A ran dry (1 expected)", (unsigned long long)(parked() - p0));
  /* The owner frees a block of A: the locked path, which puts A back on the class list. */
  void *a0 = blk[0];
  M_free(mt_hide(a0));
  CHECK(frees_parked() == f0 + 1, "%llu locked frees after a free into the parked page A (1 expected)",
        (unsigned long long)(frees_parked() - f0));
  /* B filled: its refill parks B and takes A back (one free block), which runs dry at once and is parked too; C follows. */
  size_t c0 = fill_until_new(&n, pages, 2);
  bool reused = false;
  for (size_t i = b0; i < c0; i++) reused |= blk[i] == a0;
  CHECK(reused, "the block freed into page A was not handed out again before a new page");
  CHECK(parked() == p0 + 3, "%llu pages parked by the time page C was taken (3 expected: A, B, A again)",
        (unsigned long long)(parked() - p0));
  /* The owner frees a block of B: the locked path again. */
  M_free(mt_hide(blk[b0]));
  CHECK(frees_parked() == f0 + 2, "%llu locked frees after a free into the parked page B (2 expected)",
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
