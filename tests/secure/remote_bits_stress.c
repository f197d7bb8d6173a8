/* remote_bits_stress.c — white-box stress of the secure variant's remote frees (a remote bit per block, a word
 * published in its page's summary by the free that found it empty): threads free interleaved blocks of the same
 * bitmap words while the owner keeps collecting; every block must come back exactly once. After each round every
 * page is back to what the owner holds, with no remote bit and an empty summary, and a fresh round hands out no
 * block twice. A bit lost (never reached through the summary) leaves a page with blocks counted as handed out; a
 * bit taken twice is reported by the collection as a double free (abort). Run with guard_sample:0 (CMakeLists.txt):
 * every block on a small page; and background_thread:false: no sweep gives a page of the round back. */
#define _GNU_SOURCE
#include "core/core.h"
#include "core/secure.h"
#include <mallard.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

enum { N = 384, THREADS = 3, ROUNDS = 300, MAXPAGES = 64 };
static const size_t sizes[] = { 48, 208, 3000 };   /* words of many blocks, of a few, a block over several words */
static void *blocks[N];
static _Atomic(int) started, done;

/* Frees blocks[i] for i = t (mod THREADS): the threads' frees land in the same words, in the same order. */
static void *freer(void *arg) {
  int t = (int)(intptr_t)arg;
  atomic_fetch_add(&started, 1);
  while (atomic_load(&started) < THREADS) {}
  for (int i = t; i < N; i += THREADS) mallard_free(blocks[i]);
  atomic_fetch_add(&done, 1);
  return NULL;
}

/* The pages of this round's blocks and how many blocks of them each holds. */
static page_t *pages[MAXPAGES];
static uint32_t held_before[MAXPAGES], ours[MAXPAGES];
static int npages;

static int page_index(page_t *pg) {
  for (int i = 0; i < npages; i++)
    if (pages[i] == pg) return i;
  if (npages == MAXPAGES) { fprintf(stderr, "more than %d pages\n", MAXPAGES); exit(2); }
  pages[npages] = pg;
  held_before[npages] = 0;
  ours[npages] = 0;
  return npages++;
}

/* The owner collects under its heap lock, as its slow path does (run with background_thread:false: no sweep gives
 * a page of this round back meanwhile, so the pages stay the round's). */
static void collect(page_t *pg) {
  heap_t *h = mld_tls_heap;
  mld_spin_lock(&h->lock);
  mld_page_collect_remote(pg);
  mld_spin_unlock(&h->lock);
}

static int cmp_ptr(const void *a, const void *b) {
  uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
  return x < y ? -1 : x > y;
}

int main(void) {
  int bad = 0;
  for (int r = 0; r < ROUNDS && !bad; r++) {
    size_t size = sizes[r % 3];
    npages = 0;
    for (int i = 0; i < N; i++) {
      blocks[i] = mallard_malloc(size);
      if (!blocks[i]) { fprintf(stderr, "out of memory\n"); return 2; }
    }
    /* A fresh round hands out no block twice. */
    void *sorted[N];
    for (int i = 0; i < N; i++) sorted[i] = blocks[i];
    qsort(sorted, N, sizeof sorted[0], cmp_ptr);
    for (int i = 1; i < N; i++)
      if (sorted[i] == sorted[i - 1]) { fprintf(stderr, "round %d: %p handed out twice\n", r, sorted[i]); bad = 1; }
    for (int i = 0; i < N; i++) {
      page_t *pg = page_of(segment_of(blocks[i]), blocks[i]);
      ours[page_index(pg)]++;
    }
    for (int p = 0; p < npages; p++) held_before[p] = pages[p]->used;
    atomic_store(&started, 0);
    atomic_store(&done, 0);
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, freer, (void *)(intptr_t)i);
    /* The owner collects while the frees come in (it is the pages' holder: nothing else of its heap runs). */
    while (atomic_load(&done) < THREADS)
      for (int p = 0; p < npages; p++) collect(pages[p]);
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    for (int p = 0; p < npages; p++) {
      page_t *pg = pages[p];
      collect(pg);
      uint64_t *live = bm_word(page_start(pg)), rest = 0;
      for (size_t w = 0; w < bm_page_words(pg); w++) rest |= bm_load(bm_remote_word(live + w));
      uint64_t summary = 0;
      for (size_t j = 0; j < pg->slot_count; j++) summary |= atomic_load(remote_summary(pg) + j);
      if (pg->used != held_before[p] - ours[p] || rest || summary) {
        fprintf(stderr, "round %d, %zu-byte blocks, page %p: %u handed out (expected %u), remote bits %#llx, summary %#llx\n",
                r, size, (void *)page_start(pg), pg->used, held_before[p] - ours[p], (unsigned long long)rest,
                (unsigned long long)summary);
        bad = 1;
      }
    }
  }
  if (!bad) printf("remote bits stress: ok\n");
  return bad;
}
