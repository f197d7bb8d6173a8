/* api/api.c — the allocation API: mallard_* entry points with the inlined fast paths, and (MALLARD_OVERRIDE) the malloc family. */
#define _GNU_SOURCE
#include "core/core.h"
#include "mallard.h"
#include "core/secure.h"
#include "prof/prof.h"
#include "core/junk.h"
#include "guarded/guarded.h"
#include <dlfcn.h>
#include <errno.h>
#include <string.h>
#include <unistd.h>

/* api/init.c: initialisation, registered with the core too (MLD_INIT_HOOK). Called directly from here, so that a
 * static link which takes this file takes init.c as well. */
MLD_HIDDEN void mld_api_init(void);
static inline void api_ensure_init(void) {
  if (unlikely(atomic_load_explicit(&mld_initialized, memory_order_acquire) != 2)) mld_api_init();
}

/* ---- slow paths: the layers below, then what follows an allocator call that reached them ---- */
/* After an allocation slow path (no lock held, lists consistent): the huge cache ages (so that it ages without
 * the purging thread too), and the purging thread is started once it is worth having. Never from a free path:
 * see background.c. */
static void after_alloc_slow(void) {
  mld_huge_cache_age();
  mld_purge_thread_maybe_start();
}

static MLD_NOINLINE void *alloc_slow(heap_t *h, unsigned c) {
  void *p = mld_malloc_slow(h, c);
  if (p) after_alloc_slow();
  return p;
}

/* ---- fast paths ---- */
/* A block of class c from the thread cache (the fast variant), else from the current page, or NULL when both are
 * empty (the caller's slow path). */
static inline void *alloc_class_try(heap_t *h, unsigned c) {
#ifndef MALLARD_SECURE
  void **t = h->btop[c];   /* cached blocks are counted in their pages' `used` already */
  /* h "changed" (same register, no code): gcc otherwise computes h + 8c once for btop, bbound and current, an lea
   * more than the indexed loads. */
  mld_keep_in_register(h);
  /* likely(): the cache's path falls through, the page's is the jump (glibc-thread/t2 2.4% slower the other way
   * round, the same instructions: docs/PERFORMANCE.md, forty-second pass). */
  if (likely((uint32_t)(uintptr_t)t != h->bbound[c].empty)) {
    void *cb = *t;
    if (cb == NULL) __builtin_unreachable();   /* only blocks are pushed: no test for the caller's slow path */
    h->btop[c] = t + 1;
#ifdef MALLARD_STATS
    mld_keep_in_register(h);
    h->stats.nmalloc[c]++;
#endif
    return cb;
  }
#endif
  page_t *pg = h->current[c];
  block_t *b = pg->free;
  if (likely(b != NULL)) {
    pg->free = blk_next(pg, b);
    pg->used++;
#ifdef MALLARD_SECURE
    secure_on_alloc(pg, b);
#endif
#if defined(MALLARD_STATS) && defined(MALLARD_SECURE)
    (*pg->nmalloc_count)++;   /* h->stats.nmalloc[c]: pg is h's page of class c */
#elif defined(MALLARD_STATS)
    /* Through h "changed" (same register, no code): gcc otherwise shares h + 8c between current[c] and this with an
     * extra lea, one instruction more than the indexed add. */
    mld_keep_in_register(h);
    h->stats.nmalloc[c]++;
#endif
  }
  return b;
}

static inline void *alloc_class(unsigned c) {
  heap_t *h = mld_tls_heap;
  void *b = alloc_class_try(h, c);
  return likely(b != NULL) ? b : alloc_slow(h, c);
}

/* A large or huge block: a span of slots up to span_max bytes, a huge mapping above. */
static MLD_NOINLINE void *alloc_span_or_huge(size_t size, size_t align, bool zero, size_t span_max) {
  heap_t *h = mld_heap_get();
  if (!h) {
    if (!mld_tls_exiting) { errno = ENOMEM; return NULL; }
    h = &mld_heap_empty;   /* past its heap's TLS destructor: counted in the shared record, spans from arena 0 */
  }
  void *p = mld_large_alloc(h, size, align, zero, span_max);
  if (p) after_alloc_slow();
  return p;
}

/* A new block beyond the size classes: huge above MLD_LARGE_MAX. */
static void *alloc_big(size_t size, size_t align, bool zero) { return alloc_span_or_huge(size, align, zero, MLD_LARGE_MAX); }

/* Small and medium requests take a size class (mld_class_request: room for the secure variant's canary). */
static MLD_NOINLINE void *alloc_not_small(size_t size) {
  if (size <= MLD_MEDIUM_MAX) return alloc_class(mld_size_class(mld_class_request(size)));
  return alloc_big(size, MLD_MIN_ALIGN, false);
}

/* The small classes' table index of a request: the secure variant folds its canary's 8 bytes in, so that one
 * compare covers the common path (mld_class_request's other cases, from MLD_CANARY_MAX - MLD_CANARY + 1 bytes on,
 * go through alloc_not_small). */
#ifdef MALLARD_SECURE
#define SMALL_FAST_MAX (MLD_CANARY_MAX - MLD_CANARY)
#define SMALL_FAST_INDEX(size) (((size) + MLD_CANARY + 15) >> 4)
#else
#define SMALL_FAST_MAX MLD_SMALL_MAX
#define SMALL_FAST_INDEX(size) (((size) + 15) >> 4)
#endif

/* A small request served from its class's current page, or NULL (anything else: the caller goes on to alloc). */
static inline void *alloc_try(size_t size) {
  if (likely(size <= SMALL_FAST_MAX)) return alloc_class_try(mld_tls_heap, mld_small_class[SMALL_FAST_INDEX(size)]);
  return NULL;
}

static inline void *alloc(size_t size) {
  if (likely(size <= SMALL_FAST_MAX)) return alloc_class(mld_small_class[SMALL_FAST_INDEX(size)]);
  return alloc_not_small(size);
}

/* After alloc_try found nothing: alloc's slow paths, without trying the current page again. A tail call from the
 * exported functions, so that their hit path keeps nothing for it in a register. */
static MLD_NOINLINE void *alloc_miss(size_t size) {
  if (likely(size <= SMALL_FAST_MAX)) return alloc_slow(mld_tls_heap, mld_small_class[SMALL_FAST_INDEX(size)]);
  return alloc_not_small(size);
}
static inline void *alloc_hit_or_miss(size_t size) {
  void *p = alloc_try(size);
  return likely(p != NULL) ? p : alloc_miss(size);
}

/* Blocks outside Mallard's segments: guarded blocks (guarded.c), then huge blocks aligned beyond a segment. */
static MLD_NOINLINE void free_foreign(void *p, const char *what) {
  if (mld_guard_owns(p)) {
    mld_prof_forget(p);   /* a guarded block may be a profiler sample too; its record goes before the slot can be reused */
    mld_guard_free(p, __builtin_return_address(0));   /* the free stack starts in the function that called free() */
    return;
  }
  segment_t *s = mld_big_aligned_find(p, true);
  if (s) {
    mld_prof_forget(p);
    mld_huge_free(mld_tls_heap, s, p);
    return;
  }
  mld_report_invalid(what, p);
}

/* ---- junk:free|true (junk.h): freed small blocks ----
 * The block's usable bytes get the free pattern before the block goes on a list (whose push then writes the link
 * into its first word, and leaves the secure variant's canary, past the usable bytes, as it was). Only a block
 * start is filled, and in the secure variant only a live block with its canary intact (checked first, so that a
 * double or invalid free is reported as such, before any byte is written). */
static MLD_NOINLINE void junk_small(page_t *pg, void *p) {
  size_t off = (size_t)((uint8_t *)p - page_start(pg));
  if (off % pg->block_size) return;   /* not a block start (the fast variant's invalid free): nothing of ours */
#ifdef MALLARD_SECURE
  secure_check_free(pg, p);
#endif
  memset(p, MLD_JUNK_FREE_BYTE, mld_block_usable(pg->block_size));
}

/* Race-delay builds: an owner's unlocked push must land in a page that stayed its own all along (a take from outside
 * leaves the page of the owner's hazard alone; a hand-over or claim never has a page the owner is freeing into). */
#ifdef MALLARD_RACE_DELAY
#define RACE_CHECK_STILL_OWN(pg, h) \
  do { if (atomic_load_explicit(&(pg)->heap, memory_order_relaxed) != (h)) mld_fatal("an owner's free went into a page taken meanwhile"); } while (0)
#else
#define RACE_CHECK_STILL_OWN(pg, h) ((void)0)
#endif

/* The owner emptied a page that does not stay: it goes to the page cache or its arena (heap.c). */
static MLD_NOINLINE void retire(heap_t *h, page_t *pg) {
  mld_page_retire_owner(h, pg);
  mld_huge_cache_age();
}

/* The owner frees into a page whose owner_slow was set (the fast path tests in_full and junk_free at once): the
 * block is filled under junk:free, then it goes to a parked page's locked path (heap.c), or as the fast path does.
 * in_full is read again, with acquire, then `heap`: a page parked when the fast path looked may
 * have been handed to another heap since (heap.c sweep_parked), its in_full cleared by its adopter; its block is
 * then a remote free. In_full read 0 with `heap` still ours stays so while this runs: a page of which the owner
 * holds a block is parked by the owner, or from outside by a take that leaves the page of the owner's hazard alone
 * (stored by dealloc before it read owner_slow), and only a parked page is handed over. */
static inline __attribute__((always_inline)) void owner_free_slow(void *p) {   /* in its two callers: one call */
  page_t *pg = page_of(segment_of(p), p);
  if (pg->junk_free) junk_small(pg, p);
  if (__atomic_load_n(&pg->in_full, __ATOMIC_ACQUIRE)) { mld_free_parked(p); return; }
  heap_t *h = mld_tls_heap;
  if (unlikely(atomic_load_explicit(&pg->heap, memory_order_relaxed) != h)) { mld_free_remote(pg, p); return; }
  mld_owner_push(pg, p);
  RACE_CHECK_STILL_OWN(pg, h);
  if (mld_used_release_dec(pg) == 0 && !pg->keep_on_empty) retire(h, pg);   /* last write into the page */
}

static inline void owner_free(heap_t *h, page_t *pg, void *p);

/* free() of a block whose slot's descriptor does not name the calling thread's heap: a block past its own page's
 * first slot (the owner's too), remote small frees, large, huge and invalid pointers. */
static MLD_NOINLINE void free_not_own(segment_t *seg, page_t *slot, void *p) {
  if (unlikely(seg->kind == SEG_HUGE)) {
    if (p == seg->user) mld_prof_forget(p);   /* sampled blocks are large or huge: their record goes first */
    mld_huge_free(mld_tls_heap, seg, p);   /* checks that p is the live block of the mapping */
    mld_huge_cache_age();
    return;
  }
  page_t *pg = slot - slot->offset;
  heap_t *h = mld_tls_heap;
  uint16_t slow = __atomic_load_n(&pg->owner_slow, __ATOMIC_ACQUIRE);   /* before `heap`: see dealloc */
  if (slot != pg && atomic_load_explicit(&pg->heap, memory_order_relaxed) == h) {
    if (slow) owner_free_slow(p);   /* a page of several slots of our own: the owner's paths */
    else owner_free(h, pg, p);
    return;
  }
  if (likely(pg->kind == PAGE_SMALL)) {
    if (unlikely(pg->junk_free)) junk_small(pg, p);   /* before the block is published to its owner */
    mld_free_remote(pg, p);
    return;
  } else if (pg->kind == PAGE_LARGE && p == pg->user) {
    mld_prof_forget(p);
    mld_large_free(h, pg, p);
  } else {
    mld_report_invalid("free", p);
    return;
  }
  mld_huge_cache_age();
}

/* free() of a block whose slot's descriptor does not name the calling thread's heap h. The common case first, with
 * no call and no register saved: a remote free of a block in a small page's first slot (no junk:free), into the
 * batch its page has in this thread's outbox (core.h mld_free_remote_fast). The descriptor cannot become ours
 * meanwhile: only this thread adopts pages into its heap. Everything else is free_not_own's. A huge block's slot
 * descriptor lies in its mapping's header, whose descriptors are never written (zero: PAGE_META, large.c), so the
 * kind test sends huge blocks on without reading the segment's kind. */
_Static_assert(PAGE_META == 0 && PAGE_SMALL != 0, "a huge mapping's zeroed descriptors never read as a small page");
static MLD_NOINLINE void free_other(heap_t *h, page_t *slot, void *p) {
#ifndef MALLARD_SECURE
  if (likely(slot->offset == 0) && likely(slot->kind == PAGE_SMALL) && likely(!slot->junk_free)) {
    mld_free_remote_fast(h, slot, p);
    return;
  }
#else
  (void)h;
#endif
  free_not_own(segment_of(p), slot, p);
}

/* Our page's descriptor has owner_slow set (parked, or junk:free), read before its `heap`: the owner's slow path. A
 * function of its own, so that free() saves no register for it. */
static MLD_NOINLINE void free_flagged_own(void *p) { owner_free_slow(p); }

/* Owner free into pg, a small page of h whose owner_slow was read 0 before its `heap`: no atomic, no lock. The fast
 * variant puts the block on the thread cache while its class has room (heap.c bcache_limit), touching nothing of the
 * page: the block stays counted in its `used`, so a page handed to another heap meanwhile gets it back later (from
 * the cache, by malloc or as a remote free). A full class (or tcache:false) frees to the page. */
static inline void owner_free(heap_t *h, page_t *pg, void *p) {
#ifndef MALLARD_SECURE
  size_t c = pg->size_class;
  void **t = h->btop[c];
  mld_keep_in_register(h);   /* no shared h + 8c for btop and bbound: an lea more than the indexed accesses */
  if (likely((uint32_t)(uintptr_t)t != h->bbound[c].full)) {   /* room: nothing of the block or its page is written */
    t[-1] = p;
    h->btop[c] = t - 1;
#ifdef MALLARD_STATS
    (*pg->nfree_count)++;
#endif
    return;
  }
#endif
  mld_owner_push(pg, p);
  RACE_CHECK_STILL_OWN(pg, h);
  /* `used` is the last thing written into the page, with release (internal.h): a sweep that reads it equal to
   * the page's published remote frees knows this free is done (heap.c sweep_unparked). Empty, and not the
   * current page that may stay (heap.c: make_current): retired. */
  if (unlikely(mld_used_release_dec(pg) == 0) && !pg->keep_on_empty) retire(h, pg);
}

static inline void dealloc(void *p) {
  segment_t *seg = segment_of(p);
  if (unlikely(!mld_owned(seg))) {
    if (p) free_foreign(p, "free");
    return;
  }
  /* The block's slot's own descriptor, not page_of(): only a page's first descriptor ever names a heap
   * (mld_span_set_used clears the others), so a match is our own small page with no dependent load of `offset`
   * on the way (a block past its page's first slot goes through free_not_own). */
  page_t *pg = slot_page(seg, p);
  mld_keep_in_register(pg);
  heap_t *h = mld_tls_heap;
  /* The block this free is into, published before owner_slow is read (release: the previous free's writes are
   * visible to whoever sees this one's block): a thread parking an idle owner's page from outside sets in_full,
   * runs a barrier on every thread, then leaves alone the page this names (heap.c take_from_idle). The signal fence
   * keeps the compiler from moving the store after the load; the barrier does the same for the CPU. */
  atomic_store_explicit(&h->hazard, p, memory_order_release);
  atomic_signal_fence(memory_order_seq_cst);
  /* owner_slow first, with acquire, then `heap`: a parked page of an idle owner may be handed to another heap
   * (heap.c sweep_parked), whose adopter clears in_full only after `heap` names it. So owner_slow read 0 and `heap`
   * read ours is our page, unparked; parked since only by us, or from outside by a take that leaves the page of our
   * hazard alone: the unlocked push is safe. */
  if (unlikely(mld_peek_acquire_u16(&pg->owner_slow))) {   /* parked (the locked path, heap.c) or junk:free */
    /* Another thread's page is parked when its owner found it dry: a remote free goes on at once (xmalloc-test's
     * consumers: every free). */
    if (atomic_load_explicit(&pg->heap, memory_order_relaxed) == h) free_flagged_own(p);
    else free_other(h, pg, p);
    return;
  }
  mld_after_acquire_test();
  if (likely(atomic_load_explicit(&pg->heap, memory_order_relaxed) == h)) {
    owner_free(h, pg, p);
    return;
  }
  free_other(h, pg, p);
}

/* Usable size of a block we own, 0 (after a report) for a pointer we do not. */
static size_t usable_size(const void *p, const char *what) {
  segment_t *seg = segment_of(p);
  if (unlikely(!mld_owned(seg))) {
    if (mld_guard_owns(p)) return mld_guard_size(p, what);   /* exactly the requested size: the slack is checked */
    segment_t *s = mld_big_aligned_find(p, false);
    if (s) return s->user_size;
    mld_report_invalid(what, p);
    return 0;
  }
  if (seg->kind == SEG_HUGE) {
    if (p == seg->user) return seg->user_size;
  } else {
    page_t *pg = page_of(seg, p);
    if (pg->kind == PAGE_SMALL) return mld_block_usable(pg->block_size);
    if (pg->kind == PAGE_LARGE && p == pg->user) return pg->large_size;
  }
  mld_report_invalid(what, p);
  return 0;
}

/* An aligned block; align is a power of two. Small requests use a class whose size is a multiple of align. */
/* The size class serving `size` bytes aligned to `align` (a power of two), or MLD_NUM_CLASSES when the
 * request needs a large or huge block. */
static unsigned class_for(size_t size, size_t align) {
  if (size > MLD_MEDIUM_MAX || align > MLD_SLOT_SIZE) return MLD_NUM_CLASSES;
  size_t want = mld_class_request(size) < align ? align : mld_class_request(size);
  if (want > MLD_MEDIUM_MAX) return MLD_NUM_CLASSES;
  unsigned c = mld_size_class(want);
  while (c < MLD_NUM_CLASSES && (mld_class_size[c] & (align - 1))) c++;   /* page starts are slot aligned */
  return c;
}

static void *alloc_aligned(size_t align, size_t size) {
  if (align <= MLD_MIN_ALIGN) return alloc(size);
  unsigned c = class_for(size, align);
  if (c < MLD_NUM_CLASSES) return alloc_class(c);
  return alloc_big(size, align, false);
}

/* Only for values already bounded (at most MLD_LARGE_MAX plus an alignment below MLD_MAX_REQUEST). */
static size_t round_to(size_t x, size_t a) { return (x + a - 1) & ~(a - 1); }

/* The usable size a request would get (jemalloc's nallocx); 0 when it cannot be served. Large requests follow
 * mld_large_alloc's arithmetic; huge ones ask mld_huge_layout, as mld_huge_alloc does. */
static size_t good_size(size_t size, size_t align) {
  if (align < MLD_MIN_ALIGN) align = MLD_MIN_ALIGN;
  if (size > MLD_MAX_REQUEST || align > MLD_MAX_REQUEST) return 0;
  unsigned c = class_for(size, align);
  if (c < MLD_NUM_CLASSES) return mld_block_usable(mld_class_size[c]);
  if (size == 0) size = 1;
  size_t extra = align > MLD_SLOT_SIZE ? align - MLD_SLOT_SIZE : 0, span, off;
  if (size <= MLD_LARGE_MAX && mld_add(size, extra, &span) && span <= (size_t)MLD_USABLE_SLOTS * MLD_SLOT_SIZE)
    return round_to(span, MLD_SLOT_SIZE) - extra;
  size_t map, usable;
  return mld_huge_layout(size, align, &off, &map, &usable) ? usable : 0;
}

/* A zeroed block: all of its usable size is zero (malloc_usable_size promises those bytes), and fresh mappings
 * are not written (they are zero already). */
static void *zalloc_aligned(size_t align, size_t size) {
  if (align < MLD_MIN_ALIGN) align = MLD_MIN_ALIGN;
  unsigned c = class_for(size, align);
  if (c < MLD_NUM_CLASSES) {
    void *p = alloc_class(c);
    if (p) memset(p, 0, mld_block_usable(mld_class_size[c]));
    return p;
  }
  return alloc_big(size, align, true);
}
static void *zalloc(size_t total) { return zalloc_aligned(MLD_MIN_ALIGN, total); }

static void *prof_alloc(size_t size, size_t align, bool zero, const void *ra);

/* A new block of `size` bytes for realloc: the sampling countdown counts it (a realloc that stays in place does not
 * count, as it allocates nothing). ra: the return address into realloc's caller. start: realloc(NULL, size), the
 * first block of a buffer the program means to grow, which above MLD_HUGE_FROM is a mapping of its own (core.h). */
static void *realloc_new(size_t size, const void *ra, bool start) {
  if (mld_prof_tick(size)) return prof_alloc(size, MLD_MIN_ALIGN, false, ra);
  if (start && size > MLD_HUGE_FROM && size <= MLD_LARGE_MAX) return alloc_span_or_huge(size, MLD_MIN_ALIGN, false, MLD_HUGE_FROM);
  return alloc(size);
}

/* junk (junk.h) and a block resized in place: the bytes given up, [size, old), get the free pattern before they
 * are released (a shrink gives whole slots or OS pages back at once; what stays of [size, old) reads as freed:
 * it was given up); a block grown in place gets the allocation pattern on its new tail [old, new usable). */
static MLD_NOINLINE void junk_given_up(void *p, size_t size, size_t old) {
  if ((mld_opt.junk & MLD_JUNK_FREE) && size < old) memset((uint8_t *)p + size, MLD_JUNK_FREE_BYTE, old - size);
}
static size_t usable_size(const void *p, const char *what);
static MLD_NOINLINE void junk_grown(void *p, size_t old) {
  size_t now = usable_size(p, "realloc");
  if ((mld_opt.junk & MLD_JUNK_ALLOC) && now > old) memset((uint8_t *)p + old, MLD_JUNK_ALLOC_BYTE, now - old);
}

/* What a realloc that grows a block to `size` in the large range (up to MLD_LARGE_MAX) asks for. Secure variant:
 * about twice the request, at most MLD_LARGE_MAX, so that the next growths fit without moving the block's guard slot
 * again (every growth in place opens the old guard slot and closes a new one: two mprotect calls, each a TLB
 * shootdown). Otherwise, and always in the fast variant, `size`. One slot less than twice: rounded up to slots, the
 * block stays under twice the request, so the next, larger request is more than half of it and is kept
 * (reallocate). size <= MLD_LARGE_MAX: no overflow. */
static size_t large_growth(size_t size, size_t old) {
#ifdef MALLARD_SECURE
  if (size <= old || size <= MLD_MEDIUM_MAX || size > MLD_LARGE_MAX) return size;
  size_t want = 2 * size - MLD_SLOT_SIZE;   /* > size: size > MLD_MEDIUM_MAX > MLD_SLOT_SIZE */
  return want <= MLD_LARGE_MAX ? want : MLD_LARGE_MAX;
#else
  (void)old;
  return size;
#endif
}

static void *reallocate(void *p, size_t size, const void *ra) {
  if (!p) return realloc_new(size, ra, true);
  if (size == 0) { dealloc(p); return NULL; }   /* glibc: realloc(p, 0) frees p and returns NULL */
  if (unlikely(size > MLD_MAX_REQUEST)) { errno = ENOMEM; return NULL; }   /* the block stays as it was */
  segment_t *seg = segment_of(p);
  size_t old, want = size;
  if (likely(mld_owned(seg))) {
    if (seg->kind == SEG_HUGE) {
      if (p != seg->user) { mld_report_invalid("realloc", p); errno = ENOMEM; return NULL; }
      old = seg->user_size;
#ifndef MALLARD_SECURE
      if (size > MLD_HUGE_FROM) {   /* a huge block stays one while realloc(NULL) would make one of that size */
        prof_rec_t rec;   /* a sampled block's record moves with it (out first: p's range may be reused at once) */
        bool sampled = mld_prof_detach(p, &rec);
        if (unlikely(mld_opt.junk)) junk_given_up(p, size, old);
        void *q = mld_huge_realloc(mld_tls_heap, seg, p, size);
        if (sampled) mld_prof_attach(q ? q : p, &rec);
        if (q && unlikely(mld_opt.junk)) junk_grown(q, old);
        if (q) return q;   /* else (e.g. the mapping spans merged pieces mremap will not move) copy below */
      }
#else
      /* The secure variant moves huge blocks (mremap would carry the guard page along): it resizes within the
       * mapping when it can, and grows by half again when it must move, so that growth costs O(n) copying. */
      if (size > MLD_HUGE_FROM) {
        if (unlikely(mld_opt.junk)) junk_given_up(p, size, old);
        if (mld_huge_resize_within(seg, size)) {
          if (unlikely(mld_opt.junk)) junk_grown(p, old);
          return p;
        }
      }
      if (size > old && size > MLD_LARGE_MAX && (!mld_add(size, size / 2, &want) || want > MLD_MAX_REQUEST))
        want = size;   /* no room to grow geometrically: exactly what was asked */
#endif
    } else {
      page_t *pg = page_of(seg, p);
      if (pg->kind == PAGE_SMALL) {
#ifdef MALLARD_SECURE
        secure_check_free(pg, p);
#endif
        old = mld_block_usable(pg->block_size);
        if (size <= old && (size > old / 2 || old <= 64)) return p;   /* fits, and not too wasteful */
      } else if (pg->kind == PAGE_LARGE && p == pg->user) {
        old = pg->large_size;
        if (size > MLD_MEDIUM_MAX && size <= MLD_LARGE_MAX) {
#ifdef MALLARD_SECURE
          /* Fits, and not too wasteful: kept as it is, as a small block is (a block grown with room to spare must
           * not give the room back at the next realloc, only to take it again). */
          if (size <= old && size > old / 2) return p;
#endif
          if (unlikely(mld_opt.junk)) junk_given_up(p, size, old);
          size_t grow = large_growth(size, old);   /* with room to spare first, else exactly what was asked */
          if ((grow != size && mld_large_resize_in_place(pg, grow)) || mld_large_resize_in_place(pg, size)) {
            if (unlikely(mld_opt.junk)) junk_grown(p, old);
            return p;
          }
        }
      } else {
        mld_report_invalid("realloc", p);
        errno = ENOMEM;
        return NULL;
      }
    }
  } else if (mld_guard_owns(p)) {   /* a guarded block always moves: a new block, the copy, the guarded one freed */
    old = mld_guard_size(p, "realloc");
    if (!old) { errno = ENOMEM; return NULL; }   /* reported (guard_action:report): the pointer stays as it was */
  } else {
    segment_t *s = mld_big_aligned_find(p, false);
    if (!s) { mld_report_invalid("realloc", p); errno = ENOMEM; return NULL; }
    old = s->user_size;
  }
  if (want == size) want = large_growth(size, old);   /* a block moving into or within the large range */
  void *q = realloc_new(want, ra, false);
  if (!q) return NULL;   /* the old block stays valid, as the standard requires */
  memcpy(q, p, old < size ? old : size);
  dealloc(p);
  return q;
}

/* ---- heap profiling (prof.h) and guarded sampling (guarded.h): the countdown's slow paths ----
 * Every allocating entry point (realloc: only when it needs a new block) subtracts the request from the thread's
 * countdown (two instructions: sub, js); when it goes negative, prof_alloc decides. The one countdown serves two
 * samplers: it holds the distance to the nearer of the profiler's next sample and the guard's next sample, and
 * prof_ahead and guard_ahead hold how much farther each one's own countdown is (so each sees exactly the bytes it
 * would see alone: the profiler's statistics do not change when guarding is on). With prof:false and guard_sample:0
 * both are 2^63-1 and the slow path is never reached.
 * A profiled block is served as a large block (a span of 64 KiB slots, or a huge mapping): its free never takes the
 * small-block fast path, so that path needs no test, and the large and huge free paths look the block up
 * (mld_prof_forget) before giving it back. A guarded block lies outside Mallard's segments: its free reaches
 * free_foreign. A block both profiled and guarded is served guarded and recorded. ra: the return address into the
 * caller, where the recorded stacks start. */
static void *sample_alloc(size_t size, size_t align, bool zero, const void *ra, bool sampled) {
  if (!sampled) return zero ? zalloc_aligned(align, size) : alloc_aligned(align, size);
  void *p = alloc_big(size, align, zero);
  if (p) mld_prof_record(p, size, ra);
  return p;
}

static __thread uint64_t prof_ahead, guard_ahead;   /* each sampler's countdown minus the shared one (both >= 0) */
/* junk:alloc|true (junk.h): every allocation comes here. The countdown is held at -1, so that every request below
 * 2^63 bytes (all that can succeed) ticks it negative, and the shared countdown waits in junk_left: each allocation
 * is counted against it as the fast path would have. */
static __thread uint64_t junk_left = (uint64_t)-1;   /* as the countdown in a new thread: its first allocation draws */

static MLD_NOINLINE void *prof_alloc(size_t size, size_t align, bool zero, const void *ra) {
  api_ensure_init();   /* options first: a thread's first allocation may be the process's */
  bool junk = mld_opt.junk & MLD_JUNK_ALLOC;
  uint64_t left = junk ? junk_left - size : mld_prof_left;
  uint64_t prof = left + prof_ahead, guard = left + guard_ahead;   /* each one's own countdown */
  bool profiled = false, guarded = false;
  if ((int64_t)prof < 0) {
    mld_prof_left = prof;
    profiled = mld_prof_take(size);   /* redraws mld_prof_left */
    prof = mld_prof_left;
  }
  if ((int64_t)guard < 0) guarded = mld_guard_take(size, &guard);
  left = (int64_t)prof < (int64_t)guard ? prof : guard;
  prof_ahead = prof - left;
  guard_ahead = guard - left;
  if (junk) {
    junk_left = left;
    mld_prof_left = (uint64_t)-1;
  } else {
    mld_prof_left = left;
  }
  void *p = NULL;
  if (unlikely(guarded)) {
    p = mld_guard_alloc(size, align, zero, ra);
    if (p && profiled) mld_prof_record(p, size, ra);
  }
  if (!p) p = sample_alloc(size, align, zero, ra, profiled);
  if (junk && p && !zero) memset(p, MLD_JUNK_ALLOC_BYTE, usable_size(p, "malloc"));   /* calloc's memory stays zero */
  return p;
}

/* `expr` serves the request unless the countdown ran out; __builtin_return_address(0) is the exported function's. */
#define PROF_ALLOC(size, align, zero, expr) \
  (mld_prof_tick(size) ? prof_alloc((size), (align), (zero), __builtin_return_address(0)) : (expr))

/* ---- the prefixed API ---- */
MLD_EXPORT MLD_HOT_ENTRY void *mallard_malloc(size_t size) { return PROF_ALLOC(size, MLD_MIN_ALIGN, false, alloc_hit_or_miss(size)); }
MLD_EXPORT MLD_HOT_ENTRY void mallard_free(void *p) { dealloc(p); }

MLD_EXPORT MLD_HOT_ENTRY void *mallard_calloc(size_t n, size_t size) {
  size_t total;
  if (unlikely(__builtin_mul_overflow(n, size, &total))) { errno = ENOMEM; return NULL; }
  return PROF_ALLOC(total, MLD_MIN_ALIGN, true, zalloc(total));
}

MLD_EXPORT void *mallard_realloc(void *p, size_t size) { return reallocate(p, size, __builtin_return_address(0)); }

MLD_EXPORT void *mallard_reallocarray(void *p, size_t n, size_t size) {
  size_t total;
  if (unlikely(__builtin_mul_overflow(n, size, &total))) { errno = ENOMEM; return NULL; }
  return reallocate(p, total, __builtin_return_address(0));
}

MLD_EXPORT void *mallard_aligned_alloc(size_t align, size_t size) {
  if (unlikely(align == 0 || (align & (align - 1)))) { errno = EINVAL; return NULL; }
  return PROF_ALLOC(size, align, false, alloc_aligned(align, size));
}

MLD_EXPORT int mallard_posix_memalign(void **out, size_t align, size_t size) {
  if (align < sizeof(void *) || (align & (align - 1))) return EINVAL;
  int saved = errno;
  void *p = PROF_ALLOC(size, align, false, alloc_aligned(align, size));
  if (!p) { errno = saved; return ENOMEM; }
  *out = p;
  return 0;
}

MLD_EXPORT void *mallard_memalign(size_t align, size_t size) {
  /* glibc: alignments that are not a power of two are rounded up to the next one. */
  if (align & (align - 1)) {
    if (align > ((size_t)1 << 62)) { errno = EINVAL; return NULL; }
    align = (size_t)1 << (64 - __builtin_clzl(align));
  }
  return PROF_ALLOC(size, align, false, alloc_aligned(align, size));
}

MLD_EXPORT void *mallard_valloc(size_t size) {
  size_t page = mld_os_page();
  return PROF_ALLOC(size, page, false, alloc_aligned(page, size));
}

MLD_EXPORT void *mallard_pvalloc(size_t size) {
  size_t r;
  size_t page = mld_os_page();
  if (!mld_round(size ? size : 1, page, &r)) { errno = ENOMEM; return NULL; }
  return PROF_ALLOC(r, page, false, alloc_aligned(page, r));
}

MLD_EXPORT size_t mallard_usable_size(const void *p) { return p ? usable_size(p, "malloc_usable_size") : 0; }
MLD_EXPORT MLD_HOT_ENTRY void mallard_free_sized(void *p, size_t size) { (void)size; dealloc(p); }
MLD_EXPORT void mallard_free_aligned_sized(void *p, size_t align, size_t size) { (void)align; (void)size; dealloc(p); }

MLD_EXPORT size_t mallard_good_size(size_t size) { return good_size(size, MLD_MIN_ALIGN); }

/* ---- jemalloc's non-standard API, for programs built against jemalloc (redis calls nallocx and then writes
 * up to the size it returns: it must describe Mallard's blocks, not jemalloc's). ---- */
#define MLD_X_ALIGN(flags) ((flags) & 0x3f ? (size_t)1 << ((flags) & 0x3f) : (size_t)MLD_MIN_ALIGN)
#define MLD_X_ZERO 0x40

MLD_EXPORT size_t mallard_nallocx(size_t size, int flags) { return good_size(size ? size : 1, MLD_X_ALIGN(flags)); }

MLD_EXPORT void *mallard_mallocx(size_t size, int flags) {
  size_t align = MLD_X_ALIGN(flags);
  if (!size) size = 1;
  if (flags & MLD_X_ZERO) return PROF_ALLOC(size, align, true, zalloc_aligned(align, size));
  return PROF_ALLOC(size, align, false, alloc_aligned(align, size));
}

MLD_EXPORT void *mallard_rallocx(void *p, size_t size, int flags) {
  size_t align = MLD_X_ALIGN(flags);
  size_t old = usable_size(p, "rallocx");
  if (align <= MLD_MIN_ALIGN && !(flags & MLD_X_ZERO)) return reallocate(p, size ? size : 1, __builtin_return_address(0));
  void *q = mallard_mallocx(size, flags);
  if (!q) return NULL;
  memcpy(q, p, old < size ? old : size);
  dealloc(p);
  return q;
}

MLD_EXPORT size_t mallard_xallocx(void *p, size_t size, size_t extra, int flags) {
  (void)size; (void)extra; (void)flags;
  return usable_size(p, "xallocx");   /* never resized in place: the current usable size */
}

MLD_EXPORT size_t mallard_sallocx(const void *p, int flags) { (void)flags; return usable_size(p, "sallocx"); }
MLD_EXPORT void mallard_dallocx(void *p, int flags) { (void)flags; dealloc(p); }
MLD_EXPORT void mallard_sdallocx(void *p, size_t size, int flags) { (void)size; (void)flags; dealloc(p); }

/* Give back what can be given back (core/background.c mld_collect); returns the bytes returned to the OS. */
static size_t collect(bool force) {
  api_ensure_init();
  return mld_collect(force);
}

MLD_EXPORT void mallard_collect(bool force) { collect(force); }

/* ---- replacing the malloc family ---- */
#ifdef MALLARD_OVERRIDE
#define ALIAS(name) __attribute__((alias(#name), used, visibility("default")))
void *malloc(size_t size) ALIAS(mallard_malloc);
void free(void *p) ALIAS(mallard_free);
void *calloc(size_t n, size_t size) ALIAS(mallard_calloc);
void *realloc(void *p, size_t size) ALIAS(mallard_realloc);
void *reallocarray(void *p, size_t n, size_t size) ALIAS(mallard_reallocarray);
void *aligned_alloc(size_t align, size_t size) ALIAS(mallard_aligned_alloc);
int posix_memalign(void **out, size_t align, size_t size) ALIAS(mallard_posix_memalign);
void *memalign(size_t align, size_t size) ALIAS(mallard_memalign);
void *valloc(size_t size) ALIAS(mallard_valloc);
void *pvalloc(size_t size) ALIAS(mallard_pvalloc);
size_t malloc_usable_size(void *p) ALIAS(mallard_usable_size);
void free_sized(void *p, size_t size) ALIAS(mallard_free_sized);
void free_aligned_sized(void *p, size_t align, size_t size) ALIAS(mallard_free_aligned_sized);
void cfree(void *p) ALIAS(mallard_free);
void *__libc_malloc(size_t size) ALIAS(mallard_malloc);
void __libc_free(void *p) ALIAS(mallard_free);
void *__libc_calloc(size_t n, size_t size) ALIAS(mallard_calloc);
void *__libc_realloc(void *p, size_t size) ALIAS(mallard_realloc);
void *__libc_memalign(size_t align, size_t size) ALIAS(mallard_memalign);
void *__libc_valloc(size_t size) ALIAS(mallard_valloc);
void *__libc_pvalloc(size_t size) ALIAS(mallard_pvalloc);
int __posix_memalign(void **out, size_t align, size_t size) ALIAS(mallard_posix_memalign);
size_t nallocx(size_t size, int flags) ALIAS(mallard_nallocx);
void *mallocx(size_t size, int flags) ALIAS(mallard_mallocx);
void *rallocx(void *p, size_t size, int flags) ALIAS(mallard_rallocx);
size_t xallocx(void *p, size_t size, size_t extra, int flags) ALIAS(mallard_xallocx);
size_t sallocx(const void *p, int flags) ALIAS(mallard_sallocx);
void dallocx(void *p, int flags) ALIAS(mallard_dallocx);
void sdallocx(void *p, size_t size, int flags) ALIAS(mallard_sdallocx);

/* glibc extensions some programs call: answered by Mallard so glibc's own (unused) heap is never consulted. */
/* glibc: 1 if some memory was released to the system, else 0. `pad` (bytes to keep at the top of glibc's main
 * heap) has no counterpart: Mallard has no such heap. */
__attribute__((visibility("default"))) int malloc_trim(size_t pad) {
  (void)pad;
  return collect(true) > 0;
}
/* mallopt, mallinfo2, mallinfo, malloc_stats, malloc_info: compat_glibc.c. */

#ifdef MALLARD_CXX_NEW
/* C++'s operator new and delete (their Itanium names), in the shared libraries only (a static link leaves them to the
 * C++ runtime: two definitions in one program would not link): a preloaded C++ program's new and delete come here
 * directly, not through its runtime's operator new into malloc (a call and a dozen instructions more per new:
 * larson, docs/PERFORMANCE.md). A new that finds no memory is handed to the runtime's own operator new of the same
 * name (the next definition): it runs the program's new_handler loop around malloc (ours again) and throws
 * std::bad_alloc, or returns NULL for the nothrow forms, as it would without Mallard. */
typedef void *(*cxx_new_t)(size_t);
typedef void *(*cxx_new_nothrow_t)(size_t, const void *);
typedef void *(*cxx_new_aligned_t)(size_t, size_t);
typedef void *(*cxx_new_aligned_nothrow_t)(size_t, size_t, const void *);

static MLD_NOINLINE void *cxx_next(const char *name) {
  void *f = dlsym(RTLD_NEXT, name);
  if (!f) mld_fatal("out of memory in C++ operator new, and no C++ runtime defines %s to report it", name);
  return f;
}
/* An alignment that is not a power of two (undefined in C++) goes to the runtime's own, which refuses it as
 * aligned_alloc (ours) does: std::bad_alloc or nullptr. (Folded away for the constant MLD_MIN_ALIGN.) */
#define CXX_NEW(size, align, expr, retry)                                                          \
  do {                                                                                                   \
    if (unlikely((align) & ((align) - 1))) return (retry);                                               \
    void *p_ = PROF_ALLOC((size), (align), false, (expr));                                               \
    return likely(p_ != NULL) ? p_ : (retry);                                                            \
  } while (0)

/* The unaligned forms: a hit on the current page returns at once; a miss goes on in cxx_new_miss (a tail call), so
 * that the common path keeps nothing in a saved register (no push and pop around it). */
enum { CXX_NEW_W, CXX_NEW_A, CXX_NEW_W_NOTHROW, CXX_NEW_A_NOTHROW };
static MLD_NOINLINE void *cxx_new_retry(size_t n, const void *nt, int form) {
  switch (form) {
    case CXX_NEW_W: return ((cxx_new_t)cxx_next("_Znwm"))(n);
    case CXX_NEW_A: return ((cxx_new_t)cxx_next("_Znam"))(n);
    case CXX_NEW_W_NOTHROW: return ((cxx_new_nothrow_t)cxx_next("_ZnwmRKSt9nothrow_t"))(n, nt);
    default: return ((cxx_new_nothrow_t)cxx_next("_ZnamRKSt9nothrow_t"))(n, nt);
  }
}
static MLD_NOINLINE void *cxx_new_miss(size_t n, const void *nt, int form) {
  void *p = alloc_miss(n);
  return likely(p != NULL) ? p : cxx_new_retry(n, nt, form);
}
#define CXX_NEW_PLAIN(size, nt, form)                                                                    \
  do {                                                                                                   \
    if (likely(!mld_prof_tick(size))) {                                                                  \
      void *p_ = alloc_try(size);                                                                        \
      return likely(p_ != NULL) ? p_ : cxx_new_miss((size), (nt), (form));                               \
    }                                                                                                    \
    void *p_ = prof_alloc((size), MLD_MIN_ALIGN, false, __builtin_return_address(0));                    \
    return likely(p_ != NULL) ? p_ : cxx_new_retry((size), (nt), (form));                                \
  } while (0)

MLD_EXPORT MLD_HOT_ENTRY void *_Znwm(size_t n) { CXX_NEW_PLAIN(n, NULL, CXX_NEW_W); }
MLD_EXPORT MLD_HOT_ENTRY void *_Znam(size_t n) { CXX_NEW_PLAIN(n, NULL, CXX_NEW_A); }
MLD_EXPORT void *_ZnwmRKSt9nothrow_t(size_t n, const void *nt) { CXX_NEW_PLAIN(n, nt, CXX_NEW_W_NOTHROW); }
MLD_EXPORT void *_ZnamRKSt9nothrow_t(size_t n, const void *nt) { CXX_NEW_PLAIN(n, nt, CXX_NEW_A_NOTHROW); }
/* std::align_val_t is a size_t; C++ requires a power of two. */
MLD_EXPORT void *_ZnwmSt11align_val_t(size_t n, size_t al) {
  CXX_NEW(n, al, alloc_aligned(al, n), ((cxx_new_aligned_t)cxx_next("_ZnwmSt11align_val_t"))(n, al));
}
MLD_EXPORT void *_ZnamSt11align_val_t(size_t n, size_t al) {
  CXX_NEW(n, al, alloc_aligned(al, n), ((cxx_new_aligned_t)cxx_next("_ZnamSt11align_val_t"))(n, al));
}
MLD_EXPORT void *_ZnwmSt11align_val_tRKSt9nothrow_t(size_t n, size_t al, const void *nt) {
  CXX_NEW(n, al, alloc_aligned(al, n),
          ((cxx_new_aligned_nothrow_t)cxx_next("_ZnwmSt11align_val_tRKSt9nothrow_t"))(n, al, nt));
}
MLD_EXPORT void *_ZnamSt11align_val_tRKSt9nothrow_t(size_t n, size_t al, const void *nt) {
  CXX_NEW(n, al, alloc_aligned(al, n),
          ((cxx_new_aligned_nothrow_t)cxx_next("_ZnamSt11align_val_tRKSt9nothrow_t"))(n, al, nt));
}
/* Every delete frees the block whatever size and alignment it is told (as free_sized does). */
void _ZdlPv(void *p) ALIAS(mallard_free);
void _ZdaPv(void *p) ALIAS(mallard_free);
void _ZdlPvm(void *p, size_t n) ALIAS(mallard_free_sized);
void _ZdaPvm(void *p, size_t n) ALIAS(mallard_free_sized);
void _ZdlPvSt11align_val_t(void *p, size_t al) ALIAS(mallard_free_sized);
void _ZdaPvSt11align_val_t(void *p, size_t al) ALIAS(mallard_free_sized);
void _ZdlPvmSt11align_val_t(void *p, size_t n, size_t al) ALIAS(mallard_free_aligned_sized);
void _ZdaPvmSt11align_val_t(void *p, size_t n, size_t al) ALIAS(mallard_free_aligned_sized);
MLD_EXPORT void _ZdlPvRKSt9nothrow_t(void *p, const void *nt) { (void)nt; dealloc(p); }
MLD_EXPORT void _ZdaPvRKSt9nothrow_t(void *p, const void *nt) { (void)nt; dealloc(p); }
MLD_EXPORT void _ZdlPvSt11align_val_tRKSt9nothrow_t(void *p, size_t al, const void *nt) { (void)al; (void)nt; dealloc(p); }
MLD_EXPORT void _ZdaPvSt11align_val_tRKSt9nothrow_t(void *p, size_t al, const void *nt) { (void)al; (void)nt; dealloc(p); }
#endif
#endif

/* True exactly for addresses inside memory Mallard has handed out and not taken back: the guarded pool
 * (guard_sample: reserved for good), small pages, large blocks' spans and huge blocks (core/owns.c). */
MLD_EXPORT bool mallard_owns(const void *p) { return mld_guard_owns(p) || mld_owns(p); }
