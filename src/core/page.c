/* core/page.c — a small page (slab) of one size class, its owner's free list `free`, and the remote frees it collects (the atomic `thread_free`; the secure variant: remote bits). */
#include "core/core.h"
#include "core/junk.h"
#include "core/secure.h"

/* The page every empty heap bin points at: its free list is always empty, so malloc falls into the slow path. */
page_t mld_page_empty = { .kind = PAGE_META };

void mld_page_init(page_t *pg, unsigned cls, heap_t *h) {
  size_t bytes = ((size_t)pg->slot_count << MLD_SLOT_SHIFT) - (pg->guarded ? mld_os_page() : 0);
  pg->free = NULL;
  atomic_store_explicit(&pg->thread_free, 0, memory_order_relaxed);
#ifdef MALLARD_SECURE
  for (size_t j = 0; j < pg->slot_count; j++)   /* its remote words are clear (page_leave) */
    atomic_store_explicit(remote_summary(pg) + j, 0, memory_order_relaxed);
#endif
  pg->used = 0;
  pg->capacity = 0;
  pg->block_size = mld_class_size[cls];
  pg->reserved = (uint32_t)(bytes / pg->block_size);
  if (pg->reserved > MLD_PAGE_BLOCKS_MAX) pg->reserved = MLD_PAGE_BLOCKS_MAX;   /* slab_sizes:16-16:16 would hold 65536 */
  pg->size_class = (uint8_t)cls;
  pg->in_full = 0;
  pg->junk_free = (mld_opt.junk & MLD_JUNK_FREE) != 0;   /* owner frees take the slow path, which fills (api.c) */
  pg->keep_check = pg->slot_count > 1;
  pg->keep_on_empty = 0;
  pg->dry_seen = 0;
  __atomic_store_n(&pg->is_current, 0, __ATOMIC_RELAXED);
  pg->next = pg->prev = NULL;
#ifdef MALLARD_SECURE
  mld_secure_page_keys(pg);   /* used == 0: no block holds a link or a canary made with the old keys */
#endif
  mld_page_set_owner(pg, h);
}

#ifdef MALLARD_SECURE
/* Link n blocks, in random order within runs of `shuffle` (option; 0 or 1: as given), in front of the page's free
 * list. */
static void push_shuffled(page_t *pg, block_t **order, size_t n) {
  size_t run = mld_opt.shuffle;   /* <= MLD_SHUFFLE_MAX (options.c) */
  if (run > 1)
    for (size_t i = 0; i < n; i += run) mld_shuffle(order + i, n - i < run ? n - i : run);
  for (size_t i = 0; i + 1 < n; i++) blk_set_next(pg, order[i], order[i + 1]);
  blk_set_next(pg, order[n - 1], pg->free);
  pg->free = order[0];
}
#endif

/* Carve the next blocks of the page (at most `most`) onto the front of its free list, in address order (the secure
 * variant: shuffled). */
static bool page_extend(page_t *pg, size_t most) {
  if (pg->capacity >= pg->reserved) return false;
  size_t bs = pg->block_size;
  /* The fast variant's first chunk of a page is a quarter: each class a thread touches once faults in 4 KiB, not 16
   * (`sleep`, which allocates a little in 18 classes: 2.25 -> 2.12 MiB peak RSS; docs/PERFORMANCE.md, issue 39's
   * twenty-fifth pass). */
  size_t n = (pg->capacity ? MLD_EXTEND_BYTES : MLD_EXTEND_FIRST) / bs;
  if (n < 4) n = 4;
  if (n > most) n = most;
  if (n > pg->reserved - pg->capacity) n = pg->reserved - pg->capacity;
  uint8_t *first = page_start(pg) + (size_t)pg->capacity * bs;
#ifdef MALLARD_SECURE
  block_t *order[MLD_EXTEND_BYTES / 16 > 4 ? MLD_EXTEND_BYTES / 16 : 4];   /* n <= max(4, MLD_EXTEND_BYTES / 16) */
  bool canary = bs <= MLD_CANARY_MAX;
  for (size_t i = 0; i < n; i++) {
    order[i] = (block_t *)(first + i * bs);
    if (canary) *canary_at(pg, order[i]) = canary_value(pg, order[i]);   /* armed once: kept while free */
  }
  /* Random allocation order inside each run of `shuffle` blocks of the chunk (16 by default; the most: the chunk
   * whole): shorter runs keep more of a program's locality and leave fewer orders to guess among. */
  push_shuffled(pg, order, n);
#else
  uint8_t *p = first;
  for (size_t i = 1; i < n; i++, p += bs) ((block_t *)p)->next = (block_t *)(p + bs);
  ((block_t *)p)->next = pg->free;
  pg->free = (block_t *)first;
#endif
  pg->capacity += (uint32_t)n;
  return true;
}

/* Carve the next chunk: MLD_EXTEND_BYTES of blocks (a page's first: MLD_EXTEND_FIRST), at least 4. */
bool mld_page_extend(page_t *pg) { return page_extend(pg, SIZE_MAX); }

/* A page none of whose blocks is live (used == 0, its remote frees collected: none can be in flight) is carved
 * afresh where it stands: its heap, lists and flags stay, its free list (in the order its blocks were freed, which
 * after a thread's random frees is a random walk over the page: a cache miss per malloc) is dropped, and the next
 * refill carves it again in address order. The secure variant's blocks are all dead (live bits clear): carving
 * re-arms their canaries. Used at a heap's take-over only: a refill takes a list of remote frees whole and unread
 * (a producer's pages, emptied by its consumer in the order it allocated, are in order already; re-carving them
 * cost xmalloc-test ×1.05). */
void mld_page_restart(page_t *pg) {
  pg->free = NULL;
  pg->capacity = 0;
}

#ifdef MALLARD_SECURE
/* Link n blocks (in address order) in front of the page's free list, starting at a random one of them and wrapping
 * around (under shuffle 0 or 1: at the first). Not shuffled as carved blocks are: the producer that gets them back
 * would meet them in random order, and a shuffle of every collection cost a cross-thread free storm (`xstorm`) 1.61x
 * the fast variant against 0.95x in address order (docs/PERFORMANCE.md "Remote frees as bits"). */
static void push_rotated(page_t *pg, block_t **order, size_t n) {
  size_t r = mld_opt.shuffle > 1 && n > 1 ? (size_t)(mld_random64() % n) : 0;
  for (size_t i = r; i + 1 < n; i++) blk_set_next(pg, order[i], order[i + 1]);   /* order[r .. n) */
  if (r > 0) {   /* then order[0 .. r) */
    blk_set_next(pg, order[n - 1], order[0]);
    for (size_t i = 0; i + 1 < r; i++) blk_set_next(pg, order[i], order[i + 1]);
  }
  blk_set_next(pg, order[r > 0 ? r - 1 : n - 1], pg->free);
  pg->free = order[r];
}

/* Take every remote free of the page (the holder: its owner, or a sweep or a reaper under the locks that keep the
 * owner out); returns how many blocks came back. From the page's summary, word by word of the remote bitmap
 * (secure.h): each word is taken whole, and each of its bits must be a live block start of the page (its live bit
 * set: bits are cleared a word at a time) with its canary intact. No block is read to find the next one: the
 * addresses come from the bitmap, so the canary loads do not wait on one another, and in address order. The
 * blocks go on the free list in address order from a random one of them (push_rotated). */
size_t mld_page_collect_remote(page_t *pg) {
  _Atomic(uint64_t) *summary = remote_summary(pg);
  const size_t nsum = pg->slot_count, bs = pg->block_size;
  const uint64_t key = pg->list_key;
  uint8_t *start = page_start(pg);
  uint64_t *live = bm_word(start);   /* the page's first live word: pages start on slots, words do not straddle */
  block_t *order[256];   /* linked in runs of up to 256 (2 KiB of stack: a refill carves with 8 KiB after this) */
  size_t k = 0, n = 0;
  for (size_t j = 0; j < nsum; j++) {   /* a summary word per slot of the page (secure.h) */
    if (atomic_load_explicit(summary + j, memory_order_relaxed) == 0) continue;
    uint64_t sum = atomic_exchange_explicit(summary + j, 0, memory_order_acquire);
    MLD_RACE_WINDOW();   /* the summary taken, its words not yet: frees into them find them non-empty, publish nothing */
    for (; sum; sum &= sum - 1) {
      size_t w = (j << (MLD_SLOT_SHIFT - MLD_BM_WORD_SHIFT)) + (size_t)__builtin_ctzll(sum);   /* its one word */
      uint64_t *rw = bm_remote_word(live + w);
      if (!bm_load(rw)) continue;
      uint64_t m = bm_remote_take(rw), v = bm_load(live + w);
      uint8_t *base = start + (w << MLD_BM_WORD_SHIFT);
      /* every bit freed by another thread must be a block handed out and not yet back */
      if (unlikely((v & m) != m)) mld_secure_fail("double free or invalid free of", base + 16 * __builtin_ctzll(m & ~v));
      __atomic_store_n(live + w, v & ~m, __ATOMIC_RELAXED);
      n += (size_t)__builtin_popcountll(m);
      for (; m; m &= m - 1) {
        block_t *b = (block_t *)(base + 16 * __builtin_ctzll(m));
        if (unlikely(canary_damaged_of(key, bs, b))) mld_secure_fail("heap buffer overflow: canary damaged after block", b);
        order[k++] = b;
        if (k == sizeof order / sizeof order[0]) {
          push_rotated(pg, order, k);
          k = 0;
        }
      }
    }
  }
  if (k) push_rotated(pg, order, k);
  if (unlikely(n > pg->used)) mld_secure_fail("remote frees outnumber the blocks handed out of the page at", start);
  pg->used -= (uint32_t)n;
  return n;
}

/* Blocks whose remote frees a collection would take now: the bits of the words the page's summary names (an owed
 * word, not named yet, is not counted). Exact while no collection runs (the caller holds the heap lock): bits are
 * only added meanwhile, so the count read never exceeds what waits. */
size_t mld_page_remote_published(const page_t *pg) {
  _Atomic(uint64_t) *summary = remote_summary(pg);
  uint64_t *live = bm_word(page_start(pg));
  size_t n = 0;
  for (size_t j = 0; j < pg->slot_count; j++) {
    for (uint64_t sum = atomic_load_explicit(summary + j, memory_order_acquire); sum; sum &= sum - 1) {
      size_t w = (j << (MLD_SLOT_SHIFT - MLD_BM_WORD_SHIFT)) + (size_t)__builtin_ctzll(sum);
      n += (size_t)__builtin_popcountll(bm_load(bm_remote_word(live + w)));
    }
  }
  return n;
}

bool mld_page_remote_waiting(const page_t *pg) {
  const _Atomic(uint64_t) *summary = remote_summary(pg);
  for (size_t j = 0; j < pg->slot_count; j++)
    if (atomic_load_explicit(summary + j, memory_order_relaxed) != 0) return true;
  return false;
}
#else
/* Take every remote free of the page; returns how many blocks came back. The list word gives its length; into an
 * empty free list (a refill: the usual case) the list goes whole, unread; else its tail is found batch by batch
 * (outbox.c: each batch's first block gives its last block), one or two lines a batch rather than one a block. */
size_t mld_page_collect_remote(page_t *pg) {
  if (atomic_load_explicit(&pg->thread_free, memory_order_relaxed) == 0) return 0;
  uintptr_t w = atomic_exchange_explicit(&pg->thread_free, 0, memory_order_acquire);
  block_t *list = (block_t *)(w & MLD_BATCH_PTR_MASK);
  if (!list) return 0;
  size_t n = w >> MLD_BATCH_COUNT_SHIFT;
  if (pg->free) {
    block_t *tail;
    for (block_t *b = list;; b = tail->next) {
      tail = ((block_t **)b)[1];
      if (!tail->next) break;
    }
    tail->next = pg->free;
  }
  pg->free = list;
  pg->used -= (uint32_t)n;
  return n;
}

bool mld_page_remote_waiting(const page_t *pg) {
  return atomic_load_explicit(&pg->thread_free, memory_order_relaxed) != 0;
}

/* Blocks whose remote frees a collection would take now: the length in the list word. Exact while no collection runs
 * (the caller holds the heap lock): batches are only pushed on top meanwhile (acquire: every push counted in the word
 * read is visible). */
size_t mld_page_remote_published(const page_t *pg) {
  return atomic_load_explicit(&pg->thread_free, memory_order_acquire) >> MLD_BATCH_COUNT_SHIFT;
}
#endif

/* Move remote frees into the allocation list; true if it is non-empty afterwards. */
bool mld_page_collect(page_t *pg) {
  mld_page_collect_remote(pg);
  return pg->free != NULL;
}

/* A page is about to serve the heap's allocations: remote frees first, else a fresh chunk; true if it has a free
 * block. The secure variant, when the page has blocks to reuse and room to carve, also carves a few blocks
 * (MLD_COIN_CARVE) at a coin toss, ahead of the recycled ones: whether the next block is a recycled or a fresh
 * one is not known in advance (DESIGN §5: allocation choosing randomly between extending and reusing). Part of
 * the random order, so shuffle:0 or 1 turns it off too. */
bool mld_page_refill(page_t *pg) {
  if (!mld_page_collect(pg)) return mld_page_extend(pg);
#ifdef MALLARD_SECURE
  if (mld_opt.shuffle > 1 && pg->capacity < pg->reserved && (mld_random64() & 1)) page_extend(pg, MLD_COIN_CARVE);
#endif
  return true;
}
