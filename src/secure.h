/* secure.h — hardening hooks of the secure variant (MALLARD_SECURE): encoded free lists, allocation bitmap, canaries. */
#ifndef MALLARD_SECURE_H
#define MALLARD_SECURE_H
#include "internal.h"

#define MLD_BITMAP_OFFSET (16 * 1024)                        /* in slot 0, after the segment header */
#define MLD_BITMAP_BYTES (MLD_SEGMENT_SIZE / 16 / 8)          /* one bit per 16-byte granule: 32 KiB */
#define MLD_GUARD_OFFSET (MLD_BITMAP_OFFSET + MLD_BITMAP_BYTES) /* rest of slot 0: PROT_NONE in the secure variant */
_Static_assert(sizeof(segment_t) <= MLD_BITMAP_OFFSET, "segment header ends before the allocation bitmap");
_Static_assert(MLD_GUARD_OFFSET < MLD_SLOT_SIZE, "bitmap and guard fit in slot 0");

#ifdef MALLARD_SECURE
#define MLD_SECURE_BUILD true
#define MLD_CANARY 8                                          /* bytes reserved at the end of a small block */
#define MLD_CANARY_MAX 4096                                   /* classes up to this size carry a canary, larger ones not */
/* The size whose class serves a request: room for the canary below MLD_CANARY_MAX, none above (a request that
 * would only fit a canary-carrying class without room for it goes to the first class above). */
static inline size_t mld_class_request(size_t size) {
  return size <= MLD_CANARY_MAX - MLD_CANARY ? size + MLD_CANARY : size <= MLD_CANARY_MAX ? MLD_CANARY_MAX + 1 : size;
}
/* Usable bytes of a block of a size class. */
static inline size_t mld_block_usable(size_t block_size) {
  return block_size <= MLD_CANARY_MAX ? block_size - MLD_CANARY : block_size;
}
extern uintptr_t mld_secret MLD_HIDDEN;
MLD_HIDDEN void mld_secure_init(void);
MLD_HIDDEN void mld_secure_fail(const char *what, const void *p) __attribute__((noreturn, cold));
MLD_HIDDEN void mld_shuffle(block_t **blocks, size_t n);

/* Free-list links are stored xor-ed with a per-page key; a decoded link must point into its page. */
static inline uintptr_t list_key(const page_t *pg) { return mld_secret ^ ((uintptr_t)pg * 0x9E3779B97F4A7C15ull); }
static inline block_t *blk_next(const page_t *pg, const block_t *b) {
  uintptr_t v = (uintptr_t)b->next ^ list_key(pg);
  /* Same 64 KiB slot as b: inside the page. Otherwise check the page's bounds (multi-slot pages). */
  if (unlikely(((v ^ (uintptr_t)b) >> MLD_SLOT_SHIFT) != 0) && v &&
      v - (uintptr_t)page_start(pg) >= ((size_t)pg->slot_count << MLD_SLOT_SHIFT))
    mld_secure_fail("free list corrupted (use after free?) in the page of", b);
  return (block_t *)v;
}
static inline void blk_set_next(const page_t *pg, block_t *b, block_t *n) {
  b->next = (block_t *)((uintptr_t)n ^ list_key(pg));
}

/* Allocation bitmap: a bit per 16-byte granule, set at the start of every live small block. Only the page's
 * owner writes a word (a word covers 1 KiB, pages are 64 KiB or more); other threads only read. */
static inline _Atomic(uint64_t) *bm_word(const void *p, uint64_t *bit) {
  segment_t *seg = segment_of(p);
  size_t g = ((uintptr_t)p - (uintptr_t)seg) >> 4;
  *bit = (uint64_t)1 << (g & 63);
  return (_Atomic(uint64_t) *)((uint8_t *)seg + MLD_BITMAP_OFFSET) + (g >> 6);
}
static inline bool bm_test(const void *p) {
  uint64_t bit;
  _Atomic(uint64_t) *w = bm_word(p, &bit);
  return atomic_load_explicit(w, memory_order_relaxed) & bit;
}
static inline void bm_flip(const void *p) {
  uint64_t bit;
  _Atomic(uint64_t) *w = bm_word(p, &bit);
  atomic_store_explicit(w, atomic_load_explicit(w, memory_order_relaxed) ^ bit, memory_order_relaxed);
}

/* The canary sits in the last 8 bytes of a small block, beyond its usable size. */
static inline uint64_t *canary_at(const page_t *pg, const void *b) {
  return (uint64_t *)((uint8_t *)b + pg->block_size - MLD_CANARY);
}
static inline uint64_t canary_value(const void *b) { return (uint64_t)(mld_secret ^ ((uintptr_t)b >> 4)); }

/* A small block is handed out: mark it live and arm its canary. */
static inline void secure_on_alloc(const page_t *pg, block_t *b) {
  bm_flip(b);
  if (pg->block_size <= MLD_CANARY_MAX) *canary_at(pg, b) = canary_value(b);
}
static inline bool canary_damaged(const page_t *pg, const void *b) {
  return pg->block_size <= MLD_CANARY_MAX && *canary_at(pg, b) != canary_value(b);
}
/* A small block comes back (any thread): it must be live, its canary intact. Returns its bitmap word (the bit
 * in *bit and the word's value in *word), so that the owner can clear the bit without a second lookup. */
static inline _Atomic(uint64_t) *secure_check_free_word(const page_t *pg, const void *b, uint64_t *bit, uint64_t *word) {
  _Atomic(uint64_t) *w = bm_word(b, bit);
  *word = atomic_load_explicit(w, memory_order_relaxed);
  if (unlikely(((uintptr_t)b & 15) || !(*word & *bit))) mld_secure_fail("double free or invalid free of", b);
  if (unlikely(canary_damaged(pg, b))) mld_secure_fail("heap buffer overflow: canary damaged after block", b);
  return w;
}
static inline void secure_check_free(const page_t *pg, const void *b) {
  uint64_t bit, word;
  secure_check_free_word(pg, b, &bit, &word);
}

/* The owner frees a small block: the checks above, then its bit is cleared. */
static inline void secure_owner_free(const page_t *pg, const void *b) {
  uint64_t bit, word;
  _Atomic(uint64_t) *w = secure_check_free_word(pg, b, &bit, &word);
  atomic_store_explicit(w, word & ~bit, memory_order_relaxed);
}
#else
#define MLD_SECURE_BUILD false
#define MLD_CANARY 0
static inline size_t mld_class_request(size_t size) { return size; }
static inline size_t mld_block_usable(size_t block_size) { return block_size; }
static inline block_t *blk_next(const page_t *pg, const block_t *b) { (void)pg; return b->next; }
static inline void blk_set_next(const page_t *pg, block_t *b, block_t *n) { (void)pg; b->next = n; }
#endif

/* The owner frees a block of its own page: the secure variant's checks, then a LIFO push on `free` (the block just
 * freed is the next one handed out, cache-warm) and the count. Shared by the fast path (api.c) and the locked path
 * into parked pages (heap.c). The caller decrements `used` and decides about retiring. */
static inline void mld_owner_push(heap_t *h, page_t *pg, block_t *b) {
#ifdef MALLARD_SECURE
  secure_owner_free(pg, b);
  if (unlikely(mld_opt.zero_on_free)) __builtin_memset(b, 0, pg->block_size);
#endif
  blk_set_next(pg, b, pg->free);
  pg->free = b;
#ifdef MALLARD_STATS
  h->stats.cls[pg->size_class].nfree++;
#else
  (void)h;
#endif
}
#endif
