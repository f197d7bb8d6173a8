/* page.c — a small page (slab) of one size class and its two free lists: the owner's `free` and the atomic `thread_free`. */
#include "internal.h"
#include "junk.h"
#include "secure.h"

/* The page every empty heap bin points at: its free list is always empty, so malloc falls into the slow path. */
page_t mld_page_empty = { .kind = PAGE_META };

void mld_page_init(page_t *pg, unsigned cls, heap_t *h) {
  size_t bytes = ((size_t)pg->slot_count << MLD_SLOT_SHIFT) - (pg->guarded ? MLD_OS_PAGE : 0);
  pg->free = NULL;
  atomic_store_explicit(&pg->thread_free, NULL, memory_order_relaxed);
  pg->used = 0;
  pg->capacity = 0;
  pg->block_size = mld_class_size[cls];
  pg->reserved = (uint32_t)(bytes / pg->block_size);
  pg->size_class = (uint8_t)cls;
  pg->in_full = 0;
  pg->junk_free = (mld_opt.junk & MLD_JUNK_FREE) != 0;   /* owner frees take the slow path, which fills (api.c) */
  pg->keep_check = pg->slot_count > 1;
  pg->keep_on_empty = 0;
  pg->next = pg->prev = NULL;
#ifdef MALLARD_SECURE
  mld_secure_page_keys(pg);   /* used == 0: no block holds a link or a canary made with the old keys */
#endif
  atomic_store_explicit(&pg->heap, h, memory_order_release);
}

/* Carve the next blocks of the page (at most `most`) onto the front of its free list, in address order (the secure
 * variant: shuffled). */
static bool page_extend(page_t *pg, size_t most) {
  if (pg->capacity >= pg->reserved) return false;
  size_t bs = pg->block_size;
  size_t n = MLD_EXTEND_BYTES / bs;
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
  /* Random allocation order inside each run of `shuffle` blocks of the chunk (option; the default runs are whole
   * chunks): shorter runs keep more of a program's locality and leave fewer orders to guess among. */
  size_t run = mld_opt.shuffle;   /* <= MLD_SHUFFLE_MAX (options.c) */
  if (run > 1)
    for (size_t i = 0; i < n; i += run) mld_shuffle(order + i, n - i < run ? n - i : run);
  for (size_t i = 0; i + 1 < n; i++) blk_set_next(pg, order[i], order[i + 1]);
  blk_set_next(pg, order[n - 1], pg->free);
  pg->free = order[0];
#else
  uint8_t *p = first;
  for (size_t i = 1; i < n; i++, p += bs) ((block_t *)p)->next = (block_t *)(p + bs);
  ((block_t *)p)->next = pg->free;
  pg->free = (block_t *)first;
#endif
  pg->capacity += (uint32_t)n;
  return true;
}

/* Carve the next chunk: MLD_EXTEND_BYTES of blocks, at least 4. */
bool mld_page_extend(page_t *pg) { return page_extend(pg, SIZE_MAX); }

#ifdef MALLARD_SECURE
/* The remote bits a collection clears, gathered by bitmap word: a direct-mapped table of 64 words (a one-slot page
 * has exactly 64; a larger page's words share entries, and an entry taken by another word is released first). */
typedef struct remote_masks_s {
  uint64_t touched;                      /* entries in use */
  uint64_t *word[64];
  uint64_t mask[64];
} remote_masks_t;

/* Clear an entry's bits in its remote word; all must be set (only the holder clears remote bits), or the list
 * named a block whose remote free never happened. */
static void remote_masks_flush(remote_masks_t *rm, unsigned i, const void *near) {
  if (unlikely(!bm_remote_release(rm->word[i], rm->mask[i]))) mld_secure_fail("remote free list corrupted near", near);
}

static inline void remote_masks_add(remote_masks_t *rm, const void *b) {
  uint64_t *w = bm_remote_word(bm_word(b)), bit = (uint64_t)1 << (bm_bit_index(b) & 63);
  unsigned i = (unsigned)(bm_granule(b) >> 6) & 63;
  uint64_t e = (uint64_t)1 << i;
  if (rm->touched & e) {
    if (rm->word[i] == w) {
      rm->mask[i] |= bit;
      return;
    }
    remote_masks_flush(rm, i, b);   /* another word of a multi-slot page: released now */
  }
  rm->touched |= e;
  rm->word[i] = w;
  rm->mask[i] = bit;
}

static void remote_masks_release(remote_masks_t *rm, const void *near) {
  for (uint64_t t = rm->touched; t; t &= t - 1) remote_masks_flush(rm, (unsigned)__builtin_ctzll(t), near);
}
#endif

/* Take every remote free of the page; returns how many blocks came back. */
size_t mld_page_collect_remote(page_t *pg) {
  if (atomic_load_explicit(&pg->thread_free, memory_order_relaxed) == NULL) return 0;
  block_t *list = atomic_exchange_explicit(&pg->thread_free, NULL, memory_order_acquire);
  if (!list) return 0;
  size_t n = 1;
  block_t *tail = list;
#ifdef MALLARD_SECURE
  /* Block by block, trusting no count a block holds: each must be a carved block start of the page (blk_next),
   * live and freed by another thread (1,1: secure.h), its canary intact, and there are at most `used` of them (a
   * longer list has a cycle). Live bits are cleared one by one (plain stores, the owner's lines). Remote bits are
   * gathered into per-word masks and cleared once per word after the walk (one locked `and` per word, not per
   * block: the list comes in random order, and these lines are the ones other threads' frees write). */
  remote_masks_t rm;
  rm.touched = 0;
  size_t bs = pg->block_size;
  bool skips = bs > 16;   /* skip hints (secure.h) */
  bool canary = bs > MLD_CACHE_LINE && bs <= MLD_CANARY_MAX;   /* a canary on another line than the block's start */
  uint64_t skey = skip_key(pg);
  /* The page's fields the walk reads, in locals: the walk's stores (bitmap words, hints) may alias them, so the
   * compiler would load them again for every block (3% of the walk's instructions under callgrind). */
  const uint64_t key = pg->list_key, magic = pg->align_magic, used = pg->used, carved = (uint64_t)pg->capacity * bs;
  const uintptr_t start = pg->start;
  for (;;) {
    /* A hint is only prefetched (an address it decodes to wrongly costs a useless prefetch, never a fault), and
     * cleared once the block has passed its checks: a block handed out again holds no stored address. */
    uintptr_t *sw = skip_word(tail), s = skips ? *sw : 0;
    if (s) {
      const uint8_t *ahead = (const uint8_t *)link_decode(skey, s);
      __builtin_prefetch(ahead);
      if (canary) __builtin_prefetch(ahead + bs - MLD_CANARY);   /* its canary, checked four steps on */
    }
    if (unlikely(n > used)) mld_secure_fail("remote free list corrupted (a cycle) at", tail);
    if (unlikely(!bm_release(tail))) mld_secure_fail("double free or invalid free of", tail);
    /* the remote free left the canary unchecked (secure.h: secure_remote_release) */
    if (unlikely(canary_damaged_of(key, bs, tail)))
      mld_secure_fail("heap buffer overflow: canary damaged after block", tail);
    if (s) *sw = 0;
    remote_masks_add(&rm, tail);
    block_t *next = link_follow(key, start, carved, magic, tail);
    if (!next) break;
    tail = next;
    n++;
  }
  remote_masks_release(&rm, tail);
#else
  /* Batch by batch (outbox.c): each batch's first block gives its last block and its length. */
  n = 0;
  for (block_t *b = list;;) {
    uintptr_t meta = ((uintptr_t *)b)[1];
    tail = (block_t *)(meta & (((uintptr_t)1 << MLD_BATCH_COUNT_SHIFT) - 1));
    n += meta >> MLD_BATCH_COUNT_SHIFT;
    if (!tail->next) break;
    b = tail->next;
  }
#endif
  blk_set_next(pg, tail, pg->free);
  pg->free = list;
  pg->used -= (uint32_t)n;
  return n;
}

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
