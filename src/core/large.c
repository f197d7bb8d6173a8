/* core/large.c — large blocks (slot spans inside segments) and huge blocks (their own aligned mapping, cached until decay). */
#define _GNU_SOURCE
#include "core/core.h"
#include "core/secure.h"
#include "core/junk.h"
#include <sys/mman.h>
#include <errno.h>
#include <string.h>

_Atomic(uint64_t) mld_huge_active;     /* bytes mapped for huge blocks in use */
_Atomic(uint64_t) mld_huge_cached;     /* bytes of freed huge mappings kept for reuse */
static pthread_mutex_t huge_lock = PTHREAD_MUTEX_INITIALIZER;
static segment_t *huge_cache;          /* freed huge mappings, newest first */
/* Huge blocks aligned beyond a segment (their header is not at segment_of(p)). The head is written under
 * huge_lock with atomic stores: frees of foreign pointers peek at it without the lock. */
static segment_t *big_aligned;
static void big_aligned_set(segment_t *s) { __atomic_store_n(&big_aligned, s, __ATOMIC_RELEASE); }
static bool big_aligned_empty(void) { return __atomic_load_n(&big_aligned, __ATOMIC_ACQUIRE) == NULL; }
static _Atomic(uint64_t) huge_due_ms;  /* when the oldest cached mapping is due (0: cache empty); a cheap check */
static _Atomic(size_t) huge_max_map;   /* the largest huge mapping ever made: bounds mld_huge_find's walk */

/* Only for sizes already bounded (headers, alignments, MLD_MAX_REQUEST): cannot overflow. */
static size_t round_up(size_t x, size_t a) { return (x + a - 1) & ~(a - 1); }

/* ---- the secure variant's freed large and huge blocks: wiped and made inaccessible ---- */
#ifdef MALLARD_SECURE
/* Freed bytes [p, p + n) (OS-page aligned), under zero_on_free: purged (the kernel drops them and they read back as
 * zero); `wipe`, the bytes accessible now, is cleared when madvise fails. */
static void freed_wipe(uint8_t *p, size_t n, uint8_t *wipe, size_t wipe_len) {
  if ((MLD_ZERO_ON_FREE_ALWAYS || mld_opt.zero_on_free) && !mld_os_purge(p, n)) memset(wipe, 0, wipe_len);
}

/* A freed large block's span [p, p + n): wiped (freed_wipe), and PROT_NONE from secure_noaccess_min (option) on.
 * Without zero_on_free it stays resident (reused without page faults), unreadable. Huge blocks: huge_retire. */
static bool noaccess(uint8_t *p, size_t n, size_t block_size, uint8_t *wipe, size_t wipe_len) {
  freed_wipe(p, n, wipe, wipe_len);
  return block_size >= mld_opt.secure_noaccess_min && mld_os_protect(p, n, false);
}

/* Freed large blocks wait here, inaccessible, before their spans go back to the arena: the next large malloc
 * does not get the block just freed, and a use after free faults meanwhile. A full quarantine sends a random
 * entry back (randomised delayed reuse). */
static pthread_mutex_t quarantine_lock = PTHREAD_MUTEX_INITIALIZER;
static page_t *quarantine[MLD_LARGE_QUARANTINE_MAX];   /* the first large_quarantine entries are used */
/* When each entry came in (ms), 0 once its memory is purged: a quarantined block stays resident (and unreadable)
 * only until the decay delay has passed, as a dirty span would, so an idle program gives it back. */
static uint64_t quarantine_since[MLD_LARGE_QUARANTINE_MAX];
static _Atomic(uint64_t) quarantine_due_ms;            /* the first unpurged entry's purge time; 0: none */

/* quarantine_lock held. */
static uint64_t quarantine_due_locked(void) {
  uint64_t oldest = 0;
  for (unsigned i = 0; i < MLD_LARGE_QUARANTINE_MAX; i++)
    if (quarantine[i] && quarantine_since[i] && (!oldest || quarantine_since[i] < oldest)) oldest = quarantine_since[i];
  return oldest ? oldest + mld_purge_age() : 0;
}

/* The span goes back as it is, closed or not (the arena opens it when it is handed out again); pg->guarded says
 * which while the block waits. */
static void large_release(page_t *pg) {
  if (pg->guarded) mld_arena_free_span_noaccess(segment_of(pg)->arena, pg);
  else mld_arena_free_span(segment_of(pg)->arena, pg);
}

static void large_quarantine(page_t *pg) {
  uint8_t *start = page_start(pg);
  size_t bytes = (size_t)pg->slot_count << MLD_SLOT_SHIFT;
  pg->guarded = noaccess(start, bytes, pg->large_size, start, bytes - MLD_SLOT_SIZE);   /* last slot: the guard */
  unsigned n = mld_opt.large_quarantine;   /* option large_quarantine: <= MLD_LARGE_QUARANTINE_MAX (options.c) */
  if (!n) { large_release(pg); return; }
  size_t i = (size_t)(mld_random64() % n);
  uint64_t now = mld_now_ms();
  pthread_mutex_lock(&quarantine_lock);
  page_t *out = quarantine[i];
  quarantine[i] = pg;
  quarantine_since[i] = now ? now : 1;
  atomic_store_explicit(&quarantine_due_ms, quarantine_due_locked(), memory_order_relaxed);
  pthread_mutex_unlock(&quarantine_lock);
  if (out) large_release(out);
  mld_dirty_notify();   /* the purging thread learns when this entry falls due */
}
#endif

/* Purge quarantined large blocks whose decay delay has passed (all of them if `all`); returns the bytes purged.
 * They stay in the quarantine, inaccessible; their spans go back to the arena as before when evicted. */
size_t mld_large_quarantine_purge(bool all) {
#ifdef MALLARD_SECURE
  if (!all && !atomic_load_explicit(&quarantine_due_ms, memory_order_relaxed)) return 0;
  uint64_t now = mld_now_ms();
  size_t bytes = 0;
  pthread_mutex_lock(&quarantine_lock);
  for (unsigned i = 0; i < MLD_LARGE_QUARANTINE_MAX; i++) {
    page_t *pg = quarantine[i];
    if (!pg || !quarantine_since[i]) continue;
    if (all || (mld_opt.dirty_decay_ms >= 0 && now - quarantine_since[i] >= mld_purge_age())) {
      size_t n = (size_t)pg->slot_count << MLD_SLOT_SHIFT;
      if (mld_os_purge(page_start(pg), n)) bytes += n;   /* PROT_NONE or not: madvise drops the pages either way */
      quarantine_since[i] = 0;
    }
  }
  atomic_store_explicit(&quarantine_due_ms, quarantine_due_locked(), memory_order_relaxed);
  pthread_mutex_unlock(&quarantine_lock);
  return bytes;
#else
  (void)all;
  return 0;
#endif
}

uint64_t mld_large_quarantine_due(void) {
#ifdef MALLARD_SECURE
  return atomic_load_explicit(&quarantine_due_ms, memory_order_relaxed);
#else
  return 0;
#endif
}

/* ---- large: spans of 64 KiB slots ---- */
void *mld_large_alloc(heap_t *h, size_t size, size_t align, bool zero, size_t span_max) {
  if (unlikely(size > MLD_MAX_REQUEST || align > MLD_MAX_REQUEST)) { errno = ENOMEM; return NULL; }
  size_t extra = align > MLD_SLOT_SIZE ? align - MLD_SLOT_SIZE : 0;   /* slot starts are 64 KiB aligned */
  if (size == 0) size = 1;   /* the aligned pointer must still lie inside the span */
  size_t span;
  if (size > span_max || !mld_add(size, extra, &span) || span > (size_t)MLD_USABLE_SLOTS * MLD_SLOT_SIZE)
    return mld_huge_alloc(h, size, align, zero);
  size_t slots = (span + MLD_SLOT_SIZE - 1) >> MLD_SLOT_SHIFT;
#ifdef MALLARD_SECURE
  /* One slot more, PROT_NONE whole (the arena closes it): a guard right after the block (the usable size stays what
   * nallocx promises); a span too long for a segment becomes a huge block of that usable size. */
  if (slots + 1 > MLD_USABLE_SLOTS) return mld_huge_alloc(h, (slots << MLD_SLOT_SHIFT) - extra, align, zero);
  slots++;
#endif
  bool was_zero;
  arena_t *a = mld_heap_arena(h);
  page_t *pg = a ? mld_arena_alloc_span(a, slots, &was_zero) : NULL;
  if (!pg) { errno = ENOMEM; return NULL; }
  uint8_t *start = page_start(pg);
  uint8_t *p = (uint8_t *)round_up((uintptr_t)start, align < MLD_MIN_ALIGN ? MLD_MIN_ALIGN : align);
  pg->user = p;
  /* p - start <= extra: what is promised does not depend on where the aligned pointer landed (= nallocx). */
#ifdef MALLARD_SECURE
  slots--;
#endif
  pg->large_size = (slots << MLD_SLOT_SHIFT) - extra;
  if (zero && !was_zero) memset(p, 0, pg->large_size);   /* all of the usable size, as calloc promises */
  MLD_STAT_ADD(h, large_nmalloc, 1);
  MLD_STAT_ADD(h, large_bytes_alloc, pg->large_size);
  __atomic_fetch_add(&segment_of(pg)->arena->large_active, pg->large_size, __ATOMIC_RELAXED);
  return p;   /* api.c starts the purging thread, if due, once this returns */
}

void mld_large_free(heap_t *h, page_t *pg, void *p) {
  (void)p;
#ifdef MALLARD_SECURE
  void *expect = p;   /* of two frees of one block, only one takes it (the other is reported) */
  if (!__atomic_compare_exchange_n(&pg->user, &expect, NULL, false, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
    mld_report_invalid("free", p);
    return;
  }
#endif
  if (mld_junk_free_on()) memset(p, MLD_JUNK_FREE_BYTE, pg->large_size);   /* still ours: before it is given back */
  MLD_STAT_ADD(h, large_nfree, 1);
  MLD_STAT_ADD(h, large_bytes_free, pg->large_size);
  arena_t *a = segment_of(pg)->arena;
  __atomic_fetch_sub(&a->large_active, pg->large_size, __ATOMIC_RELAXED);
#ifdef MALLARD_SECURE
  large_quarantine(pg);
#else
  mld_arena_free_span(a, pg);
#endif
}

/* Resize a large block without moving it: shrink gives the tail back, growth absorbs the next free span. */
bool mld_large_resize_in_place(page_t *pg, size_t size) {
  uint8_t *start = page_start(pg);
  size_t head = (size_t)((uint8_t *)pg->user - start);
  size_t slots = (head + size + MLD_SLOT_SIZE - 1) >> MLD_SLOT_SHIFT;
  arena_t *a = segment_of(pg)->arena;
  size_t old = pg->large_size;
#ifdef MALLARD_SECURE
  /* The guard slot moves with the block's end (the arena closes the new one before it opens the old); a tail
   * given back is wiped under zero_on_free first. */
  slots++;
  if (slots < pg->slot_count) {
    if (MLD_ZERO_ON_FREE_ALWAYS || mld_opt.zero_on_free) mld_os_purge(start + (slots << MLD_SLOT_SHIFT), (pg->slot_count - slots) << MLD_SLOT_SHIFT);
    mld_arena_shrink_large(a, pg, slots);
  } else if (slots > pg->slot_count) {
    if (!mld_arena_grow_large(a, pg, slots)) return false;
  }
  pg->large_size = (((size_t)pg->slot_count - 1) << MLD_SLOT_SHIFT) - head;
#else
  if (slots < pg->slot_count) mld_arena_shrink_large(a, pg, slots);
  else if (slots > pg->slot_count && !mld_arena_grow_large(a, pg, slots)) return false;
  pg->large_size = (pg->slot_count << MLD_SLOT_SHIFT) - head;
#endif
  if (pg->large_size > old) __atomic_fetch_add(&a->large_active, pg->large_size - old, __ATOMIC_RELAXED);
  else __atomic_fetch_sub(&a->large_active, old - pg->large_size, __ATOMIC_RELAXED);
  return true;
}

/* ---- huge: one mapping per block, 4 MiB aligned, with a segment header in front ----
 * mld_huge_find reads the header of a marked huge mapping under huge_lock: so a huge mapping's ownership bit is
 * cleared only under huge_lock (and before the mapping is unmapped, moved or merged away), and the bounds of a
 * marked mapping's block change only under huge_lock, or before the bit is set, or while `user` is NULL. */

static void huge_max_note(size_t map_size) {
  size_t cur = atomic_load_explicit(&huge_max_map, memory_order_relaxed);
  while (map_size > cur && !atomic_compare_exchange_weak(&huge_max_map, &cur, map_size)) {}
}

/* Clear the ownership bit of a huge mapping about to be unmapped or moved (huge_lock not held). */
static void huge_unmark(segment_t *seg) {
  pthread_mutex_lock(&huge_lock);
  mld_owner_set(seg, false);
  pthread_mutex_unlock(&huge_lock);
}

static void cache_push(segment_t *seg) {   /* huge_lock held */
  __atomic_store_n(&seg->user, NULL, __ATOMIC_RELEASE);   /* a cached mapping holds no block: a second free of the old pointer is reported, not cached */
  uint64_t due = seg->dirty_since + mld_purge_age(), cur = atomic_load(&huge_due_ms);
  if (!cur || due < cur) atomic_store(&huge_due_ms, due);
  seg->prev = NULL;
  seg->next = huge_cache;
  if (huge_cache) huge_cache->prev = seg;
  huge_cache = seg;
  atomic_fetch_add(&mld_huge_cached, seg->map_size);
}

static void cache_unlink(segment_t *seg) {   /* huge_lock held */
  if (seg->prev) seg->prev->next = seg->next; else huge_cache = seg->next;
  if (seg->next) seg->next->prev = seg->prev;
  seg->next = seg->prev = NULL;
  atomic_fetch_sub(&mld_huge_cached, seg->map_size);
}

/* Merge a freed mapping with the cached mappings right before or after it (mappings are often adjacent: pieces of
 * one split mapping always are), taking them out of the cache; the merged piece keeps the lower header, and only
 * its bit stays set. huge_lock held. */
static segment_t *cache_absorb_neighbours(segment_t *seg) {
  for (segment_t *s = huge_cache; s;) {
    segment_t *next = s->next;
    if ((uint8_t *)s + s->map_size == (uint8_t *)seg || (uint8_t *)seg + seg->map_size == (uint8_t *)s) {
      cache_unlink(s);
      segment_t *lo = s < seg ? s : seg, *hi = s < seg ? seg : s;   /* secure: both accessible whole (huge_retire) */
      lo->map_size += hi->map_size;
      huge_max_note(lo->map_size);   /* mld_huge_find walks down no further than the largest mapping: merged ones count */
      if (hi->dirty_since > lo->dirty_since) lo->dirty_since = hi->dirty_since;
      mld_owner_set(hi, false);
      seg = lo;
      next = huge_cache;   /* the grown piece may now touch another */
    }
    s = next;
  }
  return seg;
}

static void cache_insert_coalesced(segment_t *seg) { cache_push(cache_absorb_neighbours(seg)); }

/* No cached mapping fits `need`: unmap cached ones (oldest first) so that a fresh mapping does not add to
 * memory that sits unused. huge_lock held. */
static void cache_make_room(size_t need) {
  while (huge_cache && atomic_load_explicit(&mld_huge_cached, memory_order_relaxed) >= need / 2) {
    segment_t *old = huge_cache;
    while (old->next) old = old->next;   /* pushed first: the oldest */
    cache_unlink(old);
    mld_owner_set(old, false);
    mld_os_unmap(old, old->map_size);
  }
}

/* mremap a huge mapping, keeping the ownership map right: the caller has cleared the old granule's bit before the
 * mapping may move (once mremap has released the old range, another thread may map there and set its own bit), and
 * sets it again where the mapping is afterwards (where it was, when mremap fails), once the header is up to date. */
static segment_t *huge_remap(segment_t *seg, size_t old_size, size_t new_size) {
  MLD_RACE_WINDOW();
  segment_t *ns = mld_os_resize(seg, old_size, new_size);
  /* The secure variant's random address is drawn only when the mapping has to move. */
  if (!ns) ns = mld_os_move(seg, old_size, new_size, MLD_SEGMENT_SIZE, mld_segment_hint(new_size, MLD_SEGMENT_SIZE));
  MLD_RACE_WINDOW();
  if (ns) huge_max_note(new_size);
  return ns;
}

#ifdef MALLARD_SECURE
/* A freed huge block on its way into the cache (secure variant): wiped under zero_on_free, and its mapping made
 * accessible whole (a cached mapping is one mapping of one protection: split, grown and handed out without
 * opening anything). From secure_noaccess_min on, the mapping then leaves its address: mremap moves it to a new
 * random aligned range, carrying its pages, and its page tables whole where they are covered whole (one entry per
 * 2 MiB where mprotect would rewrite one per page, on free and again on reuse), and leaves the old range unmapped.
 * Every pointer into the freed block faults from then on, also once its memory is handed out again elsewhere.
 * Returns where the mapping is now; NULL: it could not be kept (a failed mprotect or mremap) and is unmapped. */
static segment_t *huge_retire(segment_t *seg, void *p) {
  size_t end = (size_t)((uint8_t *)p - (uint8_t *)seg) + seg->user_size;
  freed_wipe((uint8_t *)seg + mld_huge_header(), seg->map_size - mld_huge_header(), p, seg->user_size);
  /* [end, guard_end) is PROT_NONE (mld_huge_alloc, mld_huge_resize_within), the rest accessible */
  bool open = seg->guard_end <= end || mld_os_protect((uint8_t *)seg + end, seg->guard_end - end, true);
  if (open && seg->user_size < mld_opt.secure_noaccess_min) return seg;   /* option: kept where it is */
  /* Cached pieces still at their place (the rest of a mapping split when it was taken) move along: one mapping
   * again, as in the fast variant's cache, instead of pieces too small for the next large request. */
  pthread_mutex_lock(&huge_lock);
  if (open) seg = cache_absorb_neighbours(seg);   /* clears the bit of every piece but the lowest */
  mld_owner_set(seg, false);   /* the lowest piece's header: the merged mapping's, or the freed one's */
  pthread_mutex_unlock(&huge_lock);
  MLD_RACE_WINDOW();   /* unmarked: nothing reads the old headers from here on */
  size_t map = seg->map_size;
  segment_t *ns = open ? mld_os_move(seg, map, map, MLD_SEGMENT_SIZE, mld_segment_hint(map, MLD_SEGMENT_SIZE)) : NULL;   /* one VMA: all of it accessible */
  if (!ns) {
    mld_os_unmap(seg, map);
    return NULL;
  }
  mld_owner_set(ns, true);   /* the header came along: marked again at its new address */
  return ns;
}
#endif

/* Best fit among the cached mappings. One much larger than needed is split at a segment boundary: the tail
 * (resident memory, reused without page faults) goes back to the cache with a header of its own. */
static segment_t *huge_cache_take(size_t need, size_t *dirty) {
  if (!atomic_load_explicit(&mld_huge_cached, memory_order_relaxed)) return NULL;
  pthread_mutex_lock(&huge_lock);
  segment_t *best = NULL;
  for (segment_t *s = huge_cache; s; s = s->next)
    if (s->map_size >= need && (!best || s->map_size < best->map_size)) best = s;
  if (best) {
    cache_unlink(best);
    size_t cut = round_up(need, MLD_SEGMENT_SIZE);
    if (best->map_size >= cut + MLD_SEGMENT_SIZE) {
      /* secure variant: a cached mapping is accessible whole (huge_retire); mld_huge_alloc places the guard */
      segment_t *tail = (segment_t *)((uint8_t *)best + cut);
      memset(tail, 0, sizeof *tail);
      tail->kind = SEG_HUGE;
      tail->map_size = best->map_size - cut;
      tail->dirty_since = best->dirty_since;
      best->map_size = cut;
      mld_owner_set(tail, true);
      cache_push(tail);
    }
    if (best->map_size > need + need / 4 && best->map_size - need >= MLD_SEGMENT_SIZE) {
      cache_push(best);   /* still too large (a split was not possible): leave it for a better fit */
      best = NULL;
    }
  }
  if (!best && huge_cache) {
    /* Nothing is large enough: grow the largest cached mapping with mremap. Its resident pages move along
     * (no page faults for them); only the added part is new. */
    segment_t *big = huge_cache;
    for (segment_t *s = huge_cache; s; s = s->next)
      if (s->map_size > big->map_size) big = s;
    cache_unlink(big);
    size_t old_size = big->map_size;
    mld_owner_set(big, false);
    segment_t *grown = huge_remap(big, old_size, need);   /* one mapping of one protection (huge_retire) */
    if (grown) {
      *dirty = old_size;   /* the part added by mremap is fresh (zero) memory */
      grown->map_size = need;
      best = grown;
    }
    mld_owner_set(grown ? grown : big, true);
    if (!grown) cache_push(big);
  }
  if (!best) cache_make_room(need);
  pthread_mutex_unlock(&huge_lock);
  if (best && !*dirty) *dirty = best->map_size;
  return best;
}

/* The layout of a huge block of `size` bytes aligned to `align` (at least MLD_MIN_ALIGN): where the user pointer
 * starts in the mapping (*off), the mapping's length, guard page included (*map), and what is promised (*usable).
 * False when no mapping can serve it. Every step on the user's size is checked; nallocx asks the same question. */
bool mld_huge_layout(size_t size, size_t align, size_t *off, size_t *map, size_t *usable) {
  size_t guard = 0;
#ifdef MALLARD_SECURE
  guard = mld_os_page();   /* an inaccessible page right after every huge block */
#endif
  bool big = align >= MLD_SEGMENT_SIZE;   /* aligned beyond a segment: the header sits one alignment before */
  size_t need;
  if (size > MLD_MAX_REQUEST || align > MLD_MAX_REQUEST ||
      !(big ? (*off = align, true) : mld_round(mld_huge_header(), align, off)) ||
      !mld_add(*off, size, &need) || !mld_round(need, mld_os_page(), &need) || !mld_add(need, guard, &need) ||
      need + (big ? align : MLD_SEGMENT_SIZE) > MLD_MAX_REQUEST)   /* with the alignment slack mmap needs */
    return false;
  *map = need;
  *usable = need - *off - guard;
  return true;
}

void *mld_huge_alloc(heap_t *h, size_t size, size_t align, bool zero) {
  if (align < MLD_MIN_ALIGN) align = MLD_MIN_ALIGN;
  bool big = align >= MLD_SEGMENT_SIZE;
  size_t off, need, usable;
  if (!mld_huge_layout(size, align, &off, &need, &usable)) {
    errno = ENOMEM;
    return NULL;
  }
  size_t dirty = 0;   /* bytes from the start of a reused mapping that may hold old data */
  segment_t *seg = big ? NULL : huge_cache_take(need, &dirty);
  bool fresh = false;
  if (!seg) {
    seg = mld_os_map_aligned(need, big ? align : MLD_SEGMENT_SIZE, mld_segment_hint(need, big ? align : MLD_SEGMENT_SIZE));
    if (!seg) { errno = ENOMEM; return NULL; }
    /* A huge header's slot descriptors stay zero (PAGE_META) for the mapping's life, split pieces' too (memset in
     * huge_cache_take): free() reads the one of the block's slot and takes a zero kind for "not a small page". */
    seg->kind = SEG_HUGE;
    seg->map_size = need;
    fresh = true;
    if (mld_opt.thp) mld_os_thp(seg, need, mld_thp_advice(true));
    mld_os_name(seg, need, "mallard-huge");
    huge_max_note(need);
  }
#ifdef MALLARD_SECURE
  /* The guard page right after the block. A cached mapping is accessible whole (huge_retire), and what lies past
   * the guard stays so: no linear overflow reaches it without faulting first, and its pages, resident from an
   * earlier block, cost no page-table walk now or when the block is freed. */
  size_t end = off + usable;
  seg->guard_end = mld_os_protect((uint8_t *)seg + end, mld_os_page(), false) ? end + mld_os_page() : end;
#endif
  seg->user_size = usable;   /* a cached mapping may be larger: promise what was asked (= nallocx) */
  if (zero && !fresh && dirty > off)   /* all of the usable size that may hold old data */
    memset((uint8_t *)seg + off, 0, dirty - off < seg->user_size ? dirty - off : seg->user_size);
  __atomic_store_n(&seg->user, (uint8_t *)seg + off, __ATOMIC_RELEASE);   /* mld_huge_find reads it */
  atomic_fetch_add(&mld_huge_active, seg->map_size);
  if (big) {
    pthread_mutex_lock(&huge_lock);
    seg->next = big_aligned;
    if (big_aligned) big_aligned->prev = seg;
    big_aligned_set(seg);
    pthread_mutex_unlock(&huge_lock);
  } else if (fresh) {
    mld_owner_set(seg, true);
  }
  MLD_STAT_ADD(h, huge_nmalloc, 1);
  MLD_STAT_ADD(h, huge_bytes_alloc, seg->user_size);
  void *user = seg->user;
  return user;   /* api.c ages the huge cache and starts the purging thread, if due, once this returns */
}

/* Find (and optionally unlink) the header of a huge block aligned beyond a segment. */
void *mld_big_aligned_find(const void *p, bool remove) {
  if (big_aligned_empty()) return NULL;
  pthread_mutex_lock(&huge_lock);
  segment_t *s = big_aligned;
  while (s && s->user != p) s = s->next;
  if (s && remove) {
    if (s->prev) s->prev->next = s->next; else big_aligned_set(s->next);
    if (s->next) s->next->prev = s->prev;
    s->next = s->prev = NULL;
  }
  pthread_mutex_unlock(&huge_lock);
  return s;
}

void mld_huge_free(heap_t *h, segment_t *seg, void *p) {
  /* Claim the block: of two frees of one pointer only one finds it live (the other is reported, never cached
   * twice, which would make a cycle in the cache). */
  void *expect = p;
  if (!__atomic_compare_exchange_n(&seg->user, &expect, NULL, false, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
    mld_report_invalid("free", p);
    return;
  }
  MLD_STAT_ADD(h, huge_nfree, 1);
  MLD_STAT_ADD(h, huge_bytes_free, seg->user_size);
  atomic_fetch_sub(&mld_huge_active, seg->map_size);
  bool owned = mld_owned(seg) && segment_of(p) == seg;
  if (owned && mld_opt.dirty_decay_ms != 0 && seg->map_size <= mld_opt.huge_cache_max &&
      atomic_load(&mld_huge_cached) + seg->map_size <= mld_opt.huge_cache_max) {
    if (mld_junk_free_on()) memset(p, MLD_JUNK_FREE_BYTE, seg->user_size);   /* cached, mapped: filled (unmapped: not) */
#ifdef MALLARD_SECURE
    if (!(seg = huge_retire(seg, p))) return;   /* unmapped instead */
#endif
    pthread_mutex_lock(&huge_lock);
    seg->dirty_since = mld_now_ms();
    cache_insert_coalesced(seg);
    pthread_mutex_unlock(&huge_lock);
    mld_dirty_notify();
    mld_huge_cache_age();
    return;
  }
  if (owned) huge_unmark(seg);
  mld_os_unmap(seg, seg->map_size);
}

/* Without the purging thread (or before it starts), allocator activity ages the huge cache: called from the
 * huge paths and from arena operations, outside every lock; two atomic loads when nothing is due (the huge
 * cache's deadline and, in the secure variant, the large quarantine's). */
void mld_huge_cache_age(void) {
  uint64_t due = atomic_load_explicit(&huge_due_ms, memory_order_relaxed);
  uint64_t qdue = mld_large_quarantine_due();   /* the secure variant's quarantine ages with it (0 in the fast one) */
  if (likely(!due && !qdue) || mld_opt.dirty_decay_ms < 0) return;
  uint64_t now = mld_now_ms();
  if (due && now >= due) mld_huge_cache_purge(false);
  if (qdue && now >= qdue) mld_large_quarantine_purge(false);
}

/* The nearest granule at or below p's that the ownership map marks, no further down than the largest huge mapping
 * reaches, and its kind (0 and NULL when there is none). Headers are read through mld_owns_peek only. */
static segment_t *nearest_marked(const void *p, int *kind) {
  uintptr_t g = (uintptr_t)p >> MLD_SEGMENT_SHIFT;
  uintptr_t steps = atomic_load(&huge_max_map) >> MLD_SEGMENT_SHIFT;
  for (uintptr_t i = 0; i <= steps && i <= g; i++) {
    segment_t *seg = (segment_t *)((g - i) << MLD_SEGMENT_SHIFT);
    if (mld_owned(seg) && (*kind = mld_owns_peek(seg, NULL)) != 0) return seg;   /* a cheap look first */
  }
  *kind = 0;
  return NULL;
}

/* The huge block whose usable bytes contain p (interior pointers too), or NULL; only whether it is NULL may be used
 * (the block may be freed once huge_lock is released). The nearest marked granule at or below p is the only mapping
 * with a bit that can hold p: no marked header lies inside a mapping. Its block's bounds are read under huge_lock,
 * which keeps a marked huge mapping in place; the lock-free walk first spares it to addresses near no huge mapping. */
void *mld_huge_find(const void *p) {
  uintptr_t g = (uintptr_t)p >> MLD_SEGMENT_SHIFT;
  if (!p || g >= ((uintptr_t)1 << (MLD_ADDR_BITS - MLD_SEGMENT_SHIFT))) return NULL;
  int kind;
  bool near_huge = nearest_marked(p, &kind) && kind == SEG_HUGE;
  if (!near_huge && big_aligned_empty()) return NULL;   /* blocks aligned beyond a segment have no bit: a list */
  segment_t *found = NULL;
  pthread_mutex_lock(&huge_lock);
  segment_t *seg = near_huge ? nearest_marked(p, &kind) : NULL;   /* again, now that huge mappings stay put */
  if (seg && kind == SEG_HUGE) {
    MLD_RACE_WINDOW();   /* a free of this block now must wait for huge_lock before unmapping it */
    const uint8_t *user = __atomic_load_n(&seg->user, __ATOMIC_ACQUIRE);   /* NULL while cached (or being taken) */
    if (user && (const uint8_t *)p >= user && (const uint8_t *)p < user + seg->user_size) found = seg;
  }
  for (segment_t *s = big_aligned; s && !found; s = s->next)
    if ((const uint8_t *)p >= (const uint8_t *)s->user && (const uint8_t *)p < (const uint8_t *)s->user + s->user_size) found = s;
  pthread_mutex_unlock(&huge_lock);
  return found;
}

/* When the oldest cached mapping is due for unmapping (0: the cache is empty). huge_lock held. */
static uint64_t cache_due_locked(void) {
  uint64_t oldest = 0;
  for (segment_t *s = huge_cache; s; s = s->next)
    if (!oldest || s->dirty_since < oldest) oldest = s->dirty_since;
  return oldest ? oldest + mld_purge_age() : 0;
}

uint64_t mld_huge_cache_due(void) {
  if (!atomic_load(&mld_huge_cached)) return 0;
  pthread_mutex_lock(&huge_lock);
  uint64_t due = cache_due_locked();
  pthread_mutex_unlock(&huge_lock);
  return due;
}

/* Unmap cached huge mappings older than the decay delay (all if `all`); returns bytes unmapped. */
size_t mld_huge_cache_purge(bool all) {
  if (!atomic_load(&mld_huge_cached)) {
    if (atomic_load(&huge_due_ms)) {   /* emptied by allocations: the inline deadline must not stay behind */
      pthread_mutex_lock(&huge_lock);
      atomic_store(&huge_due_ms, cache_due_locked());
      pthread_mutex_unlock(&huge_lock);
    }
    return 0;
  }
  uint64_t now = mld_now_ms();
  size_t bytes = 0;
  pthread_mutex_lock(&huge_lock);
  segment_t *s = huge_cache;
  while (s) {
    segment_t *next = s->next;
    if (all || (mld_opt.dirty_decay_ms >= 0 && now - s->dirty_since >= mld_purge_age())) {
      cache_unlink(s);
      bytes += s->map_size;
      mld_owner_set(s, false);
      mld_os_unmap(s, s->map_size);
    }
    s = next;
  }
  atomic_store(&huge_due_ms, cache_due_locked());
  pthread_mutex_unlock(&huge_lock);
  return bytes;
}

/* Resize a huge block: the mapping grows or shrinks with mremap (moved without copying when it must). */
void *mld_huge_realloc(heap_t *h, segment_t *seg, void *p, size_t size) {
  (void)p;
  size_t off = (size_t)((uint8_t *)seg->user - (uint8_t *)seg);
  size_t need;
  if (size > MLD_MAX_REQUEST || !mld_add(off, size, &need) || !mld_round(need, mld_os_page(), &need)) {
    errno = ENOMEM;
    return NULL;
  }
  if (need == seg->map_size) {
    pthread_mutex_lock(&huge_lock);
    seg->user_size = need - off;
    pthread_mutex_unlock(&huge_lock);
    return seg->user;
  }
  size_t old = seg->map_size;
  huge_unmark(seg);
  segment_t *ns = huge_remap(seg, old, need);
  if (!ns) {
    mld_owner_set(seg, true);
    return NULL;
  }
  ns->map_size = need;
  ns->user_size = need - off;
  __atomic_store_n(&ns->user, (uint8_t *)ns + off, __ATOMIC_RELEASE);
  mld_owner_set(ns, true);
  if (need > old) atomic_fetch_add(&mld_huge_active, need - old);
  else atomic_fetch_sub(&mld_huge_active, old - need);
  MLD_STAT_ADD(h, huge_bytes_alloc, need > old ? need - old : 0);
  return ns->user;
}

/* Resize a huge block inside its mapping (guard page excluded); false when it does not fit. */
bool mld_huge_resize_within(segment_t *seg, size_t size) {
  size_t off = (size_t)((uint8_t *)seg->user - (uint8_t *)seg);
  size_t guard = 0;
#ifdef MALLARD_SECURE
  guard = mld_os_page();
#endif
  size_t cap = seg->map_size - off - guard;
  if (size > cap) return false;
  size_t user_size = round_up(off + size, mld_os_page()) - off;
  if (user_size > cap) user_size = cap;
#ifdef MALLARD_SECURE
  /* [block end, guard_end) is PROT_NONE (mld_huge_alloc): its start moves with the block's end, so the guard stays
   * adjacent. Growth opens up to the new end and, past the closed pages, closes a guard page there; pages given up
   * by a shrink are purged and closed. */
  size_t old_end = off + seg->user_size, new_end = off + user_size, guard_end = seg->guard_end;
  if (new_end > old_end) {
    if (!mld_os_protect((uint8_t *)seg + old_end, new_end - old_end, true)) return false;
    if (new_end >= guard_end)   /* new_end <= cap: the page fits the mapping */
      guard_end = mld_os_protect((uint8_t *)seg + new_end, mld_os_page(), false) ? new_end + mld_os_page() : new_end;
  } else if (new_end < old_end) {
    mld_os_purge((uint8_t *)seg + new_end, old_end - new_end);
    if (mld_os_protect((uint8_t *)seg + new_end, old_end - new_end, false) && guard_end < old_end) guard_end = old_end;
  }
#endif
  pthread_mutex_lock(&huge_lock);
  seg->user_size = user_size;
#ifdef MALLARD_SECURE
  seg->guard_end = guard_end;
#endif
  pthread_mutex_unlock(&huge_lock);
  return true;
}

void mld_huge_fork_prepare(void) {
#ifdef MALLARD_SECURE
  pthread_mutex_lock(&quarantine_lock);
#endif
  pthread_mutex_lock(&huge_lock);
}
void mld_huge_fork_parent(void) {
  pthread_mutex_unlock(&huge_lock);
#ifdef MALLARD_SECURE
  pthread_mutex_unlock(&quarantine_lock);
#endif
}
void mld_huge_fork_child(void) {
  pthread_mutex_init(&huge_lock, NULL);
#ifdef MALLARD_SECURE
  pthread_mutex_init(&quarantine_lock, NULL);
#endif
  mld_owns_fork_child();
}
