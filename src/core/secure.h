/* core/secure.h — hardening hooks of the secure variant (MALLARD_SECURE): encrypted free lists, allocation bitmap, canaries, delayed reuse. */
#ifndef MALLARD_SECURE_H
#define MALLARD_SECURE_H
#include "core/core.h"

#define MLD_SUMMARY_OFFSET (12 * 1024)                       /* in slot 0, after the segment header: a line per slot */
#define MLD_BITMAP_OFFSET (16 * 1024)                        /* in slot 0, after the remote summaries */
#define MLD_BITMAP_BYTES (MLD_SEGMENT_SIZE / 16 / 8)          /* one bit per 16-byte granule: 32 KiB */
#define MLD_REMOTE_OFFSET (MLD_BITMAP_OFFSET + MLD_BITMAP_BYTES) /* the remote-free bitmap, on lines of its own */
#define MLD_GUARD_OFFSET (MLD_REMOTE_OFFSET + MLD_BITMAP_BYTES) /* rest of slot 1: PROT_NONE in the secure variant */
_Static_assert(sizeof(segment_t) <= MLD_SUMMARY_OFFSET, "segment header ends before the remote summaries");
_Static_assert(MLD_SUMMARY_OFFSET + MLD_SLOTS * MLD_CACHE_LINE <= MLD_BITMAP_OFFSET, "summaries end before the bitmap");

#ifdef MALLARD_SECURE
#define MLD_SECURE_BUILD true
_Static_assert(MLD_GUARD_OFFSET < MLD_FIRST_SLOT * MLD_SLOT_SIZE, "bitmaps and guard fit in the metadata slots");
/* Defaults of the secure variant's options guard_slab_interval, secure_noaccess_min, large_quarantine,
 * delayed_reuse and shuffle (options.c; docs/SECURITY.md gives their cost): a build may change a default with -D. */
#ifndef MLD_GUARD_SLAB_INTERVAL
#define MLD_GUARD_SLAB_INTERVAL 4            /* guard pages among small pages at most max(this, the page's slots)
                                              * slots apart (arena.c span_wants_guard; hardened_malloc's guard
                                              * slabs); 0: none */
#endif
#ifndef MLD_SECURE_NOACCESS_MIN
#define MLD_SECURE_NOACCESS_MIN (256 * 1024) /* freed large blocks from this size PROT_NONE, huge ones moved away */
#endif
#ifndef MLD_LARGE_QUARANTINE
#define MLD_LARGE_QUARANTINE 2               /* freed large blocks held inaccessible; a random one goes back; 0: none
                                              * (at most MLD_LARGE_QUARANTINE_MAX). Two: the block just freed is
                                              * never the next one handed out, and the held footprint stays small
                                              * (8 cost realloc-heavy programs up to 1.2x more: PERFORMANCE.md) */
#endif
#ifndef MLD_ZERO_ON_FREE_ALWAYS
#define MLD_ZERO_ON_FREE_ALWAYS 0            /* 1: wipe on every free whatever zero_on_free says (cost measurement) */
#endif
#ifndef MLD_DELAYED_REUSE
#define MLD_DELAYED_REUSE 1                  /* an owner's free goes second on its page's list, not first; 0: first */
#endif
#ifndef MLD_SHUFFLE
#define MLD_SHUFFLE 16                       /* fresh blocks in random order within runs of this many (page.c);
                                              * MLD_SHUFFLE_MAX: each carved chunk whole (a program's locality pays:
                                              * pydict-json 1.2x more, PERFORMANCE.md); 0 or 1: address order (and
                                              * collected blocks from the first, not a random one) */
#endif
#ifndef MLD_COIN_CARVE
#define MLD_COIN_CARVE 8                     /* blocks a refill carves ahead of the recycled ones when its coin says
                                              * so (page.c mld_page_refill): a few, so the footprint stays put */
#endif
#if MLD_SHUFFLE > MLD_SHUFFLE_MAX
#error "MLD_SHUFFLE exceeds a carved chunk's most blocks (MLD_SHUFFLE_MAX)"
#endif
#if MLD_LARGE_QUARANTINE > MLD_LARGE_QUARANTINE_MAX
#error "MLD_LARGE_QUARANTINE exceeds the quarantine's array (MLD_LARGE_QUARANTINE_MAX)"
#endif
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
MLD_HIDDEN void mld_secure_init(void);
MLD_HIDDEN void mld_secure_fork_child(void);
MLD_HIDDEN bool mld_secure_weak_seed(void);
MLD_HIDDEN uint64_t mld_random64(void);
MLD_HIDDEN void mld_secure_report(const char *what, const void *p) __attribute__((noreturn, cold));
/* The report is reached by a jump (platform.h MLD_COLD_JUMP; the entry is in secure.c): a call on the fast paths
 * makes every malloc and free align the stack for it, although it never returns. */
#define mld_secure_fail(what, p) MLD_COLD_JUMP(mld_secure_fail_entry, mld_secure_report, (what), (const void *)(p))
MLD_HIDDEN void mld_shuffle(block_t **blocks, size_t n);
MLD_HIDDEN void mld_secure_page_keys(page_t *pg);

/* ---- free-list links ----
 * A link is stored encrypted with its page's key: E(n) = P(n ^ k) ^ k, P a public bijection (xor-shift, multiply).
 * Changing stored bits without the key decodes to an unpredictable address, which the checks below reject; copying
 * a link moves its target without exposing it. The end of a list is stored as 0, not E(NULL): no stored byte is a
 * function of the key alone. (E(n) == 0 for a real n would only cut the list short: a leak, never a reuse.) */
#define MLD_MIX 0x9E3779B97F4A7C15ull                         /* odd: invertible modulo 2^64 */
#define MLD_MIX_INV 0xF1DE83E19937733Dull                     /* MLD_MIX * MLD_MIX_INV == 1 (mod 2^64) */
static inline uintptr_t link_encode(uint64_t k, const block_t *n) {
  if (!n) return 0;
  uint64_t x = (uintptr_t)n ^ k;
  x ^= x >> 32;
  return (uintptr_t)((x * MLD_MIX) ^ k);
}
static inline uintptr_t link_decode(uint64_t k, uintptr_t e) {
  uint64_t x = (e ^ k) * MLD_MIX_INV;
  return (uintptr_t)(x ^ (x >> 32) ^ k);   /* x ^ x >> 32 is its own inverse */
}
/* The next block after b on pg's list: a carved block start of the page (bounds and block alignment), or NULL.
 * Whether it is really free is checked when it is handed out (the allocation bitmap). */
static inline block_t *blk_next(const page_t *pg, const block_t *b) {
  uintptr_t e = (uintptr_t)b->next;
  if (!e) return NULL;
  uintptr_t v = link_decode(pg->list_key, e);
  uint64_t off = v - pg->start;
  if (unlikely(off >= (uint64_t)pg->capacity * pg->block_size || off * pg->align_magic >= pg->align_magic))
    mld_secure_fail("free list corrupted (use after free?): bad link in the block at", b);
  return (block_t *)v;
}
static inline void blk_set_next(const page_t *pg, block_t *b, block_t *n) {
  b->next = (block_t *)link_encode(pg->list_key, n);
}

/* ---- two bitmaps, a bit per 16-byte granule of the segment, for the small block that starts there ----
 * live: set while the block is handed out. Written only by whoever holds the block's page (its owner, or a sweep
 * or an adopter under the locks that keep the owner out): plain loads and stores, no locked instruction. A word
 * covers 1 KiB and pages start on 64 KiB slots: a word belongs to one page.
 * remote: set by another thread's free (a locked read-modify-write: of two remote frees exactly one finds it
 * clear); the bit is the remote free (no list, no batch), published per word in the page's summary (below) and
 * taken with its word when the page's holder collects. On lines of its own: remote frees never write the owner's
 * lines, and the owner reads them only to check and to collect.
 * A block is (live, remote) = (1,0) handed out, (1,1) freed by another thread and waiting, (0,0) free. A hand-out
 * requires (0,0), an owner's free (1,0), a remote free remote clear, a collection (1,1): two frees in any order
 * are caught; an owner's and a remote free racing past each other's checks leave (0,1), which neither a hand-out
 * nor a collection accepts, so no block is ever handed out twice. */
static inline uint64_t bm_granule(const void *p) { return ((uintptr_t)p & (MLD_SEGMENT_SIZE - 1)) >> 4; }
/* The granule index modulo 64 is all a bit test within a word needs: the register forms of bt/bts/btr take their
 * bit offset modulo 64, so the address shifted right by 4 serves (one instruction less than bm_granule). */
static inline uint64_t bm_bit_index(const void *p) { return (uintptr_t)p >> 4; }
static inline uint64_t *bm_word(const void *p) {
  return (uint64_t *)(((uintptr_t)p & ~(uintptr_t)(MLD_SEGMENT_SIZE - 1)) + MLD_BITMAP_OFFSET) + (bm_granule(p) >> 6);
}
#define MLD_BM_WORD_SHIFT 10   /* a bitmap word covers 1 KiB of the segment (64 granules of 16 bytes) */
/* How many bitmap words a page spans (its slots; the same count in each bitmap). */
static inline size_t bm_page_words(const page_t *pg) { return (size_t)pg->slot_count << (MLD_SLOT_SHIFT - MLD_BM_WORD_SHIFT); }
/* The remote word of the same granules: a fixed distance after the live word. */
static inline uint64_t *bm_remote_word(uint64_t *live_word) { return live_word + MLD_BITMAP_BYTES / 8; }
/* Relaxed atomic accesses (plain moves): other threads read or set bits of words their page's holder writes. */
static inline uint64_t bm_load(const uint64_t *w) { return __atomic_load_n(w, __ATOMIC_RELAXED); }
static inline bool bm_bit(uint64_t v, const void *p) { return mld_bit_test(v, bm_bit_index(p)); }
static inline bool bm_live(const void *p) { return bm_bit(bm_load(bm_word(p)), p); }
static inline bool bm_remote(const void *p) { return bm_bit(bm_load(bm_remote_word(bm_word(p))), p); }
/* The page's holder hands p out: its live bit set, its remote bit clear; false (nothing written) otherwise. */
static inline bool bm_claim(const void *p) {
  uint64_t *w = bm_word(p), v = bm_load(w), r = bm_load(bm_remote_word(w));
  bool was = mld_bit_test_set(&v, bm_bit_index(p));
  if (was || bm_bit(r, p)) return false;
  __atomic_store_n(w, v, __ATOMIC_RELAXED);
  return true;
}
/* The page's holder takes p back: its live bit cleared; false (nothing written) if it was clear. */
static inline bool bm_release(const void *p) {
  uint64_t *w = bm_word(p), v = bm_load(w);
  bool was = mld_bit_test_reset(&v, bm_bit_index(p));
  if (!was) return false;
  __atomic_store_n(w, v, __ATOMIC_RELAXED);
  return true;
}
/* A remote free sets p's remote bit and returns the word as it was: p's bit set in it means a free of p is waiting
 * (a double free); the word zero means no free of its granules was waiting, and this free publishes the word in
 * its page's summary (below). Release: the block, as the freeing thread left it, is visible to the holder that
 * takes the bit. (The whole old word is needed: a compare-and-swap loop, where `lock bts` would give one bit.) */
static inline uint64_t bm_remote_set(const void *p) {
  return __atomic_fetch_or(bm_remote_word(bm_word(p)), (uint64_t)1 << (bm_bit_index(p) & 63), __ATOMIC_RELEASE);
}
/* The holder takes every bit of a remote word (acquire: pairs with bm_remote_set). */
static inline uint64_t bm_remote_take(uint64_t *remote_word) { return __atomic_exchange_n(remote_word, 0, __ATOMIC_ACQUIRE); }

/* ---- remote summaries ----
 * A small page's summary: one word per slot of the page, bit k of word j standing for the page's remote word
 * j * 64 + k (a slot spans 64 bitmap words), so that every summary bit names exactly one remote word. The words lie
 * in slot 0, on the cache lines of the page's own slots (word j of a page starting at slot s: line s, word j; a
 * 16-slot page's words 8-15 run into line s + 1, which is its own slot's line too): no two pages share a line, and
 * remote frees never write the page descriptor, whose first line the owner's fast paths read. Set by the remote
 * free that found its word empty, after setting its own bit; each summary word taken whole by the holder, which then
 * takes each word of a taken bit whole. A set remote bit is always reached through a summary bit set after it: its
 * own, or that of the free which found the word empty, whose bit stays in the word until the holder takes the word
 * whole. Invariant: a word owed to the summary (found empty, its bit not yet published) cannot be reached, since
 * no other bit names it: its blocks stay counted in `used`, and the page stays in use until the bit is sent. (A
 * bit shared by several words, as once, let a collection reach an owed word through another word's bit: the page
 * emptied and was released before the late send wrote its summary.) */
static inline _Atomic(uint64_t) *remote_summary(const page_t *pg) {
  return (_Atomic(uint64_t) *)((uintptr_t)segment_of(pg) + MLD_SUMMARY_OFFSET + slot_index(pg) * MLD_CACHE_LINE);
}
/* The summary word (index into remote_summary(pg)) of the remote word holding block b of pg: its slot in the page. */
static inline size_t remote_summary_index(const page_t *pg, const void *b) {
  return ((uintptr_t)b - pg->start) >> MLD_SLOT_SHIFT;
}
/* The summary bit, in that word, of the remote word holding block b. */
static inline uint64_t remote_summary_bit(const page_t *pg, const void *b) {
  return (uint64_t)1 << ((((uintptr_t)b - pg->start) >> MLD_BM_WORD_SHIFT) & 63);
}

/* ---- canaries: the last 8 bytes of a small block, beyond its usable size ----
 * A keyed hash of the block's address with its page's key (a 128-bit multiply by the key, folded): the key is
 * not stored in any byte a program can read, and a canary read from one page says nothing about another page.
 * Armed when the block is carved (page.c) and never rewritten while the page keeps its key: every owner's free and
 * every collection of a remote free checks it, and nothing writes past a free block's usable bytes (links are in
 * its first word; wipes and junk fills stop at the usable size), so a block handed out again still carries it. A
 * write after free that damages it is reported at the block's next free (or its collection). */
/* Where the canary of a block of this size lies: its last MLD_CANARY bytes. */
static inline uint64_t *canary_slot(size_t block_size, const void *b) {
  return (uint64_t *)((uint8_t *)b + block_size - MLD_CANARY);
}
static inline uint64_t *canary_at(const page_t *pg, const void *b) { return canary_slot(pg->block_size, b); }
static inline uint64_t canary_of(uint64_t key, const void *b) {
  __uint128_t m = (__uint128_t)((uintptr_t)b ^ key) * (key | 1);
  return (uint64_t)m ^ (uint64_t)(m >> 64);
}
static inline uint64_t canary_value(const page_t *pg, const void *b) { return canary_of(pg->list_key, b); }
/* The same from a page's key and block size (a collection keeps them in registers). */
static inline bool canary_damaged_of(uint64_t key, size_t block_size, const void *b) {
  return block_size <= MLD_CANARY_MAX && *canary_slot(block_size, b) != canary_of(key, b);
}
static inline bool canary_damaged(const page_t *pg, const void *b) {
  return canary_damaged_of(pg->list_key, pg->block_size, b);
}

/* zero_on_free's wipe (platform.h mld_wipe: inline, no call on the free fast path). */
static inline void secure_wipe(void *p, size_t n) { mld_wipe(p, n); }

/* A small block is handed out (its link already decoded): it must be free, it becomes live, and its link word is
 * cleared (it held the next free block's encrypted address). Its canary is in place already. */
static inline void secure_on_alloc(const page_t *pg, block_t *b) {
  if (unlikely(!bm_claim(b))) {
    /* freed by another thread after its owner freed it (a double free found now), or a corrupted list */
    if (!bm_live(b) && bm_remote(b)) mld_secure_fail("double free or invalid free of", b);
    mld_secure_fail("free list corrupted: the next block to hand out is not free:", b);
  }
  b->next = NULL;
  (void)pg;
}
/* A small block is about to be resized or copied (any thread): live, not freed by another thread, canary intact. */
static inline void secure_check_free(const page_t *pg, const void *b) {
  if (unlikely(((uintptr_t)b & 15) || !bm_live(b) || bm_remote(b))) mld_secure_fail("double free or invalid free of", b);
  if (unlikely(canary_damaged(pg, b))) mld_secure_fail("heap buffer overflow: canary damaged after block", b);
}
/* The owner frees a small block of its page: live (its bit is cleared now), not freed by another thread, canary
 * intact. */
static inline void secure_owner_release(const page_t *pg, const void *b) {
  if (unlikely(((uintptr_t)b & 15) || !bm_release(b) || bm_remote(b))) mld_secure_fail("double free or invalid free of", b);
  if (unlikely(canary_damaged(pg, b))) mld_secure_fail("heap buffer overflow: canary damaged after block", b);
}
/* Another thread frees a small block: a block start of the page (its live bit, on the owner's lines, and its
 * canary, on a line this thread may never have touched, are checked by the holder when it takes the block:
 * page.c), zero_on_free's wipe, then its remote bit set (a second free, by any thread, finds it while it waits).
 * The wipe comes first: once the bit is set the holder may take the block and hand it out. Returns the remote
 * word as it was (outbox.c publishes it when it was empty). */
static inline uint64_t secure_remote_release(const page_t *pg, void *b) {
  uint64_t off = (uintptr_t)b - pg->start, magic = pg->align_magic;
  if (unlikely(off * magic >= magic)) mld_secure_fail("double free or invalid free of", b);   /* not a block start */
  if (MLD_ZERO_ON_FREE_ALWAYS || unlikely(mld_opt.zero_on_free)) {
    /* the block must be one the page holds (a start past the last block would wipe beyond the page) */
    if (unlikely(off >= (uint64_t)pg->reserved * pg->block_size)) mld_secure_fail("double free or invalid free of", b);
    secure_wipe(b, mld_block_usable(pg->block_size));
  }
  uint64_t old = bm_remote_set(b);
  if (unlikely(bm_bit(old, b))) mld_secure_fail("double free or invalid free of", b);
  return old;
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
 * freed is the next one handed out, cache-warm; the secure variant puts it second) and the count. Shared by the
 * fast path (api.c) and the locked path into parked pages (heap.c). The caller decrements `used` and decides about retiring. */
static inline void mld_owner_push(page_t *pg, block_t *b) {
#ifdef MALLARD_SECURE
  /* Delayed reuse: the block goes in second place, so the next malloc of the class does not return the block
   * just freed (unless it is the page's only free block). Links are not bound to their place: head's stored
   * link moves to b as it is. */
  secure_owner_release(pg, b);
  block_t *head = pg->free;
  /* zero_on_free and delayed_reuse:false in one byte (options.c): the default path tests one byte for both. */
  if (unlikely(mld_opt.owner_free_flags)) {
    /* read again (relaxed atomic: not merged with the test above, which stays one compare with memory) */
    uint8_t f = __atomic_load_n(&mld_opt.owner_free_flags, __ATOMIC_RELAXED);
    if (f & MLD_OWNER_FREE_WIPE) secure_wipe(b, mld_block_usable(pg->block_size));   /* the canary stays */
    if (f & MLD_OWNER_FREE_FIRST) head = NULL;   /* no delayed reuse: pushed first, as an empty list's block is */
  }
  if (likely(head != NULL)) {
    b->next = head->next;
    blk_set_next(pg, head, b);
  } else {
    blk_set_next(pg, b, pg->free);
    pg->free = b;
  }
#else
  block_t *head = pg->free;
  MLD_RACE_WINDOW_SOMETIMES();   /* unlocked on the fast path: no take from outside may have this page meanwhile */
  blk_set_next(pg, b, head);
  pg->free = b;
#endif
#ifdef MALLARD_STATS
  (*pg->nfree_count)++;   /* the owner's counter of the class (mld_page_set_owner) */
#endif
}
#endif
