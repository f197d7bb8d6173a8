/* owed_summary_stress.c — white-box test of the secure variant's owed summary bits on every page geometry: a word
 * whose summary bit waits in a thread's outbox cannot be collected, so its page cannot empty before the late send.
 * Part 1, exact: thread A frees one block of a page (its word found empty: A owes the word's summary bit and keeps it
 * in its outbox), thread B frees the page's other blocks and exits (its bits sent), the owner collects: A's block
 * must still be counted in `used` (a summary bit shared by several words let the collection reach A's word through
 * B's bit, the page emptied, and A's send later wrote into a released page). Part 2, stress: freeing threads exit
 * with bits pending while the owner collects and gives empty pages and segments back (dirty_decay_ms:0): a late
 * send into a released segment faults. Run by CMakeLists.txt under the default slab sizes and docs/OPTIONS.md's
 * examples, in the release and race-delay builds, and by tests/secure/tsan.sh under ThreadSanitizer. */
#define _GNU_SOURCE
#include "core/core.h"
#include "core/secure.h"
#include <mallard.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

/* Sizes on one-slot pages, on the 2-slot pages of `1-1024:2` and on the 16-slot pages of `8K-64K:16`. */
static const size_t sizes[] = { 48, 1000, 8192, 20000 };
enum { NSIZES = sizeof sizes / sizeof sizes[0], NBLOCKS = 256 };

/* ---- part 1 ---- */
static void *blocks[NBLOCKS];
static int nblocks;
static void *a_block;
static _Atomic(int) a_freed, a_go;

static void *thread_a(void *arg) {
  (void)arg;
  mallard_free(a_block);   /* a remote free that finds its word empty: the word's summary bit is owed, batched */
  atomic_store(&a_freed, 1);
  while (!atomic_load(&a_go)) sched_yield();
  return NULL;             /* the thread's exit sends the bit */
}

static void *thread_b(void *arg) {
  (void)arg;
  for (int i = 0; i < nblocks; i++) mallard_free(blocks[i]);
  return NULL;             /* exit: every bit B owes is sent */
}

/* The owner collects its page, holding its heap lock as its slow path does (a sweep may look at the heap). */
static void owner_collect(page_t *pg) {
  heap_t *h = mld_tls_heap;
  mld_spin_lock(&h->lock);
  mld_page_collect_remote(pg);
  mld_spin_unlock(&h->lock);
}

static int part1(size_t size) {
  /* Blocks until a page holds at least 4 of ours; that page is the one tested, the rest freed at the end. */
  void *all[2048];
  int n = 0;
  page_t *pg = NULL;
  while (!pg && n < 2048) {
    all[n] = mallard_malloc(size);
    if (!all[n]) { fprintf(stderr, "out of memory\n"); exit(2); }
    page_t *p = page_of(segment_of(all[n]), all[n]);
    n++;
    int same = 0;
    for (int i = 0; i < n; i++) same += page_of(segment_of(all[i]), all[i]) == p;
    if (same >= 4 && same * size >= 4096) pg = p;
  }
  if (!pg) { fprintf(stderr, "%zu: no page with 4 blocks\n", size); exit(2); }
  /* A frees the page's lowest block of ours; B the other ones of the page. */
  a_block = NULL;
  nblocks = 0;
  for (int i = 0; i < n; i++)
    if (page_of(segment_of(all[i]), all[i]) == pg && (!a_block || all[i] < a_block)) a_block = all[i];
  for (int i = 0; i < n; i++)
    if (page_of(segment_of(all[i]), all[i]) == pg && all[i] != a_block) blocks[nblocks++] = all[i];
  uint32_t before = pg->used;
  atomic_store(&a_freed, 0);
  atomic_store(&a_go, 0);
  pthread_t a, b;
  pthread_create(&a, NULL, thread_a, NULL);
  while (!atomic_load(&a_freed)) sched_yield();
  pthread_create(&b, NULL, thread_b, NULL);
  pthread_join(b, NULL);
  owner_collect(pg);
  int bad = 0;
  uint32_t expect = before - (uint32_t)nblocks - 1;   /* every block of ours back */
  if (pg->used <= expect) {
    fprintf(stderr, "%zu-byte blocks, page %p (%u slots): every remote free collected (%u handed out) while thread A "
            "still owes its word's summary bit: the page could be released before A's send\n",
            size, (void *)page_start(pg), pg->slot_count, pg->used);
    bad = 1;
  }
  atomic_store(&a_go, 1);
  pthread_join(a, NULL);
  owner_collect(pg);
  if (pg->used != expect) {
    fprintf(stderr, "%zu-byte blocks: %u handed out after every send, expected %u\n", size, pg->used, expect);
    bad = 1;
  }
  for (int i = 0; i < n; i++)
    if (page_of(segment_of(all[i]), all[i]) != pg) mallard_free(all[i]);
  return bad;
}

/* ---- part 2 ---- */
enum { THREADS = 4, PER = 96, ROUNDS = 60 };
static void *share[THREADS][PER];

static void *freer(void *arg) {
  void **mine = arg;
  for (int i = 0; i < PER; i++) mallard_free(mine[i]);
  if ((uintptr_t)mine[0] & 16) mallard_collect(false);   /* some threads send before they exit, some at exit */
  return NULL;
}

static void part2(void) {
  uint64_t seed = 0x9E3779B97F4A7C15ull;
  for (int r = 0; r < ROUNDS; r++) {
    size_t size = sizes[r % NSIZES];
    /* Blocks dealt at random: the threads' frees land in the same words and the same pages. */
    void **all = &share[0][0];
    for (int i = 0; i < THREADS * PER; i++) {
      all[i] = mallard_malloc(size);
      if (!all[i]) { fprintf(stderr, "out of memory\n"); exit(2); }
    }
    for (int i = THREADS * PER - 1; i > 0; i--) {
      int j = (int)(mld_xorshift64s(&seed) % (uint64_t)(i + 1));
      void *x = all[i];
      all[i] = all[j];
      all[j] = x;
    }
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++) pthread_create(&th[t], NULL, freer, share[t]);
    /* The owner takes what comes back, and gives empty pages and their segments back, while the threads free. */
    for (int k = 0; k < 50; k++) mallard_collect(true);
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
    mallard_collect(true);
  }
}

int main(void) {
  int bad = 0;
  for (int i = 0; i < NSIZES; i++) bad |= part1(sizes[i]);
  part2();
  if (!bad) printf("owed summary bits: ok\n");
  return bad;
}
