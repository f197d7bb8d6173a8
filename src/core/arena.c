/* core/arena.c — arenas: they own segments, hand out slot spans (best fit, coalescing), keep abandoned pages, and decay dirty spans. */
#define _GNU_SOURCE
#include "core/core.h"
#include "core/secure.h"
#include <sys/mman.h>
#include <string.h>
#include <time.h>

arena_t *mld_arenas[MLD_MAX_ARENAS];
_Atomic(unsigned) mld_narenas;
static pthread_mutex_t arenas_create_lock = PTHREAD_MUTEX_INITIALIZER;


/* Lock with contention accounting: an uncontended acquisition costs one trylock. */
void mld_lock(pthread_mutex_t *m, lock_stats_t *st) {
  if (pthread_mutex_trylock(m) != 0) {
    uint64_t t0 = mld_now_ns();
    pthread_mutex_lock(m);
    mld_tls_contended = true;
    st->contended++;
    st->wait_ns += mld_now_ns() - t0;
  }
  st->ops++;
}

static void arena_lock(arena_t *a) { mld_lock(&a->lock, &a->lock_stats); }
static void arena_unlock(arena_t *a) { pthread_mutex_unlock(&a->lock); }

arena_t *mld_arena_get(unsigned index) {
  return index < atomic_load_explicit(&mld_narenas, memory_order_acquire) ? mld_arenas[index] : NULL;
}

/* Create one more arena; returns its index or -1. */
int mld_arena_create(void) {
  pthread_mutex_lock(&arenas_create_lock);
  unsigned n = atomic_load(&mld_narenas);
  int r = -1;
  if (n < MLD_MAX_ARENAS) {
    arena_t *a = mld_meta_alloc(sizeof(arena_t));
    if (a) {
      pthread_mutex_init(&a->lock, NULL);
      a->index = n;
      mld_arenas[n] = a;
      atomic_store_explicit(&mld_narenas, n + 1, memory_order_release);
      r = (int)n;
    }
  }
  pthread_mutex_unlock(&arenas_create_lock);
  return r;
}

/* fork(): arena creation is not in progress while the child is made. */
void mld_arenas_fork_prepare(void) { pthread_mutex_lock(&arenas_create_lock); }
void mld_arenas_fork_parent(void) { pthread_mutex_unlock(&arenas_create_lock); }
static void free_span_locked(arena_t *a, page_t *pg, uint64_t now);
size_t mld_arenas_fork_relisted;

/* A span that a thread of the parent was purging without the lock (mld_arena_purge) goes back as a freed span does,
 * dirty: whether its madvise ran is unknown, and dirty (not known to be zero) is true either way. */
void mld_arenas_fork_child(void) {
  pthread_mutex_init(&arenas_create_lock, NULL);
  unsigned n = atomic_load(&mld_narenas);
  uint64_t now = mld_now_ms();
  for (unsigned i = 0; i < n; i++) {
    arena_t *a = mld_arenas[i];
    for (page_t *pg = a->purging, *next; pg; pg = next) {
      next = pg->next;
      free_span_locked(a, pg, now);
      mld_arenas_fork_relisted++;
    }
    a->purging = NULL;
  }
}

/* ---- protection of slots (secure variant) ----
 * Guard slabs: the last OS page of some small pages is PROT_NONE, chosen by position (span_wants_guard), so that a
 * linear overflow from a small page faults within max(guard_slab_interval, its page's slots) slots. A large
 * block's span ends in a guard slot, PROT_NONE whole, and a freed large block from secure_noaccess_min on is
 * PROT_NONE whole. None of this is undone when a span goes back to
 * the free spans: the segment's masks (prot_tail, prot_full) record it, and a span is opened or guarded when it is
 * handed out, only where its state differs from what its new use wants. A page that goes back and comes out again
 * at the same place (a thread's pages, a large block's span) costs no mprotect at all. */
#ifdef MALLARD_SECURE
_Static_assert(MLD_SLOTS == 64, "one 64-bit mask per segment covers its slots");
enum { WANT_OPEN, WANT_TAIL, WANT_FULL };   /* the span's last slot: accessible, guard page at its end, no access */

typedef struct prot_plan_s {
  uint8_t *open, *open_end;                 /* made PROT_READ|PROT_WRITE (NULL: nothing) */
  uint8_t *close, *close_end;               /* made PROT_NONE (NULL: nothing) */
  uint64_t bit;                             /* the last slot's mask bit */
  int want;
} prot_plan_t;

/* Guard slabs by position. Pages of s slots have segments of their own and are cut from slot MLD_FIRST_SLOT on,
 * back to back (every span of such a segment starts a whole number of pages from it), so they end at slots
 * MLD_FIRST_SLOT + k * s. Counted back from the last page that fits in the segment, which is always guarded (an
 * overflow never leaves the segment), every (n / s)-th page ends in a guard page, every page when s >= n: guard
 * pages at most max(n, s) slots apart (n: guard_slab_interval), whatever s and n are. (A guard every n slots of
 * position would miss pages of s slots for good when no multiple of n is a page end: 4, 8, 12, 16 slots with n 4.) */
static size_t guard_stride(size_t s) {   /* slots from one guarded page's end to the next one's */
  size_t m = mld_opt.guard_slab_interval / s;   /* whole pages in the interval */
  return (m ? m : 1) * s;
}
static size_t slab_last_end(size_t s) { return MLD_FIRST_SLOT + MLD_USABLE_SLOTS / s * s; }

/* The end (a slot index) of the guarded page of s slots at or after the page that ends at `end`; 0: none (guard
 * slabs off). */
static size_t guard_end_from(size_t end, size_t s) {
  size_t last = slab_last_end(s);
  if (!mld_opt.guard_slab_interval || end > last) return 0;
  return end + (last - end) % guard_stride(s);
}

static bool span_wants_guard(const page_t *pg) {
  size_t end = slot_index(pg) + pg->slot_count;
  return guard_end_from(end, pg->slot_count) == end;
}

/* Arena lock held, the small page pg (not guarded itself) taken: the guard page that ends the run of pages it
 * belongs to, when it is not closed yet and the page it ends is free (a page in use there got its guard, or lost
 * it when mprotect failed: its last OS page may hold blocks). So an overflow from pg faults within the promised
 * distance even where no page after it was handed out yet. Returns the OS page to close (NULL: none), its mask bit
 * set already (*bit): a page handed out there meanwhile counts on it, which is true once it is closed. */
static uint8_t *next_guard_plan(page_t *pg, uint64_t *bit) {
  segment_t *seg = segment_of(pg);
  size_t s = pg->slot_count, g = guard_end_from(slot_index(pg) + s, s);
  if (!g || g == slot_index(pg) + s) return NULL;
  *bit = 1ull << (g - 1);
  const page_t *first = &seg->pages[g - s];   /* the first slot of the guarded page's place */
  /* a free span's inner slots have slot_count 0 or kind PAGE_FREE (span_mark_free, coalescing); a span being
   * purged is free too (its guard page closed meanwhile is recorded, and madvise leaves the protection alone) */
  bool in_use = first->kind != PAGE_FREE && first->kind != PAGE_PURGING && first->slot_count;
  if (in_use || ((seg->prot_tail | seg->prot_full) & *bit)) return NULL;
  seg->prot_tail |= *bit;
  return (uint8_t *)seg + (g << MLD_SLOT_SHIFT) - mld_os_page();
}

/* Slots [idx, idx + n) of a segment as mask bits (1 <= idx, idx + n <= 64). */
static uint64_t slot_bits(size_t idx, size_t n) { return (n >= 64 ? ~0ull : (1ull << n) - 1) << idx; }

/* Arena lock held, the span [pg, pg + n) taken: what to change so that all of it is accessible but its last slot
 * (as `want` says), and the masks updated to that state already (the syscalls follow without the lock: the span is
 * ours alone). */
static prot_plan_t prot_plan(page_t *pg, size_t n, int want) {
  segment_t *seg = segment_of(pg);
  size_t idx = slot_index(pg), last = idx + n - 1;
  uint64_t span = slot_bits(idx, n), lastbit = 1ull << last;
  uint64_t tail = seg->prot_tail & span, full = seg->prot_full & span;
  prot_plan_t p = { .bit = lastbit, .want = want };
  bool done = (want == WANT_TAIL && (tail & lastbit) && !(full & lastbit)) || (want == WANT_FULL && (full & lastbit));
  uint64_t open = (tail | full) & ~(want == WANT_OPEN ? 0 : lastbit);   /* a last slot to be closed whole: not opened */
  if (want == WANT_TAIL && !done) open |= full & lastbit;                /* opened whole, then its tail closed */
  if (open) {
    p.open = (uint8_t *)seg + ((size_t)__builtin_ctzll(open) << MLD_SLOT_SHIFT);
    p.open_end = (uint8_t *)seg + ((size_t)(64 - __builtin_clzll(open)) << MLD_SLOT_SHIFT);
  }
  if (!done && want != WANT_OPEN) {
    p.close_end = (uint8_t *)seg + ((last + 1) << MLD_SLOT_SHIFT);
    p.close = p.close_end - (want == WANT_TAIL ? mld_os_page() : MLD_SLOT_SIZE);
  }
  seg->prot_tail &= ~span;
  seg->prot_full &= ~span;
  if (want == WANT_TAIL) seg->prot_tail |= lastbit;
  if (want == WANT_FULL) seg->prot_full |= lastbit;
  return p;
}

/* No lock held. false: the span could not be opened (mprotect failed, e.g. too many mappings). A guard that could
 * not be placed is only missing: its bit is cleared, under the lock. */
static bool prot_apply(arena_t *a, const prot_plan_t *p, bool *closed) {
  *closed = !p->close;
  if (p->open && !mld_os_protect(p->open, (size_t)(p->open_end - p->open), true)) return false;
  if (p->close) {
    *closed = mld_os_protect(p->close, (size_t)(p->close_end - p->close), false);
    if (!*closed) {
      segment_t *seg = segment_of(p->close);
      arena_lock(a);
      if (p->want == WANT_TAIL) seg->prot_tail &= ~p->bit; else seg->prot_full &= ~p->bit;
      arena_unlock(a);
    }
  }
  return true;
}
#endif

/* ---- span bookkeeping (arena lock held) ---- */

static void span_mark_free(page_t *pg, size_t n) {
  pg->kind = PAGE_FREE;
  pg->slot_count = (uint32_t)n;
  pg->offset = 0;
  atomic_store_explicit(&pg->heap, NULL, memory_order_relaxed);
  page_t *last = pg + n - 1;
  if (last != pg) { last->offset = (uint32_t)(n - 1); last->kind = PAGE_FREE; last->slot_count = 0; }
}

void mld_span_set_used(page_t *pg, size_t n, uint8_t kind) {
  pg->kind = kind;
  pg->slot_count = (uint32_t)n;
  pg->offset = 0;
  /* Every slot leads back to the first (page_of() is O(1) for interior pointers) and names no heap: the free fast
   * path takes a slot's descriptor naming the thread's heap for the page itself (api.c dealloc). */
  for (size_t i = 1; i < n; i++) {
    pg[i].offset = (uint32_t)i;
    pg[i].kind = kind;
    pg[i].slot_count = 0;
    atomic_store_explicit(&pg[i].heap, NULL, memory_order_relaxed);
  }
}

static void span_insert(arena_t *a, page_t *pg) {
  size_t n = pg->slot_count;
  page_t **head = &a->spans[segment_of(pg)->use][n];
  if (!pg->purged || !*head) {            /* dirty spans go first: reusing them costs no page faults */
    pg->prev = NULL;
    pg->next = *head;
    if (*head) (*head)->prev = pg;
    *head = pg;
  } else {
    page_t *t = *head;
    while (t->next) t = t->next;
    t->next = pg;
    pg->prev = t;
    pg->next = NULL;
  }
  if (pg->purged) a->purged_slots += n; else a->dirty_slots += n;
  segment_of(pg)->free_slots += (uint32_t)n;
}

static void span_remove(arena_t *a, page_t *pg) {
  size_t n = pg->slot_count;
  if (pg->prev) pg->prev->next = pg->next; else a->spans[segment_of(pg)->use][n] = pg->next;
  if (pg->next) pg->next->prev = pg->prev;
  pg->next = pg->prev = NULL;
  if (pg->purged) a->purged_slots -= n; else a->dirty_slots -= n;
  segment_of(pg)->free_slots -= (uint32_t)n;
}

/* The free tail `rest` (n slots) of a split free span `from`: listed, in the state of `from` (lock held). */
static void span_insert_rest(arena_t *a, page_t *rest, size_t n, const page_t *from) {
  span_mark_free(rest, n);
  rest->purged = from->purged;
  rest->zero = from->zero;
  rest->dirty_since = from->dirty_since;
  rest->purge_age = from->purge_age;
  span_insert(a, rest);
}

static segment_t *segment_new(arena_t *a, unsigned use) {
  segment_t *seg = mld_os_map_aligned(MLD_SEGMENT_SIZE, MLD_SEGMENT_SIZE, mld_segment_hint(MLD_SEGMENT_SIZE, MLD_SEGMENT_SIZE));
  if (!seg) return NULL;
  if (mld_opt.thp) mld_os_thp(seg, MLD_SEGMENT_SIZE, mld_thp_advice(false));
  mld_os_name(seg, MLD_SEGMENT_SIZE, "mallard");
#ifdef MALLARD_SECURE
  /* Metadata lives apart from user data: the tail of the metadata slots is a guard between them. */
  /* From the first page boundary on (48 KiB at 4 and 16 KiB pages; none at 64 KiB, where the bitmaps' page is the
   * slot's last: docs/DESIGN.md "Page size"). */
  size_t guard = (MLD_GUARD_OFFSET + mld_os_page() - 1) & ~(mld_os_page() - 1);
  if (guard < MLD_FIRST_SLOT * MLD_SLOT_SIZE)
    mld_os_protect((uint8_t *)seg + guard, MLD_FIRST_SLOT * MLD_SLOT_SIZE - guard, false);
#endif
  seg->kind = SEG_NORMAL;
  seg->use = use;
  seg->arena = a;
  seg->pages[0].kind = PAGE_META;
  page_t *pg = &seg->pages[MLD_FIRST_SLOT];
  span_mark_free(pg, MLD_USABLE_SLOTS);
  pg->purged = 1;                          /* never touched: neither resident nor dirty */
  pg->zero = 1;
  pg->dirty_since = 0;                     /* never purged either (decay_note_reuse) */
  seg->next = a->segments;
  if (a->segments) a->segments->prev = seg;
  a->segments = seg;
  a->nsegments++;
  a->nsegments_mapped++;
  span_insert(a, pg);
  mld_owner_set(seg, true);
  return seg;
}

void mld_segment_release(arena_t *a, segment_t *seg) {
  span_remove(a, &seg->pages[MLD_FIRST_SLOT]);
  if (seg->prev) seg->prev->next = seg->next; else a->segments = seg->next;
  if (seg->next) seg->next->prev = seg->prev;
  a->nsegments--;
  a->nsegments_unmapped++;
  mld_owner_set(seg, false);
  mld_os_unmap(seg, MLD_SEGMENT_SIZE);
}

/* The automatic arenas (threads spread over them; arenas.create adds others, for binding only): those made at
 * start-up, at most `narenas` and the mallopt(M_ARENA_MAX) cap. */
unsigned mld_arenas_auto(void) {
  unsigned n = atomic_load_explicit(&mld_narenas, memory_order_acquire);
  unsigned autos = mld_opt.narenas && mld_opt.narenas < n ? mld_opt.narenas : mld_auto_arenas;
  if (autos > n) autos = n;   /* some automatic arenas could not be made (no memory at initialisation) */
  unsigned cap = atomic_load_explicit(&mld_arena_cap, memory_order_relaxed);
  if (cap && autos > cap) autos = cap;
  return autos;
}

/* ---- the decay's length: lengthened while what it purged is faulted in again soon after ---- */

static _Atomic(uint64_t) decay_ext_seen;   /* when the lengthened decay last spared or asked for memory, ms */
/* Segments unmapped by age and not mapped again, process-wide like the decay: a thread moves to another automatic
 * arena under contention (its arena's lock is held by another thread), and the segment it maps there
 * still refaults what its old arena unmapped. The last one's purge time and age then (decay_note_segment). */
static _Atomic(unsigned) decay_unmapped;
static _Atomic(uint64_t) decay_unmap_at, decay_unmap_age;
#define DECAY_UNMAPPED_MAX 1024u   /* a bound on that count only: past it, unmaps are not counted (no lengthening) */

/* Memory purged by age faulted in again at `now`, after an idle gap (dirty for purge_age, then purged for `since`)
 * that the longest decay covers with half of it again as a margin: the decay becomes dirty_decay_max_ms. A bursty
 * program (work, a pause of seconds, work again) then keeps its memory across its pauses, as with a longer
 * dirty_decay_ms, while one idle for longer still gives it back. Not 1.5 times this gap: pauses vary (rptest's are
 * 2 s, then 6 s while it replaces its threads), and a decay fitted to the first one purges again at the next longer
 * one, a refault each time (issue 39's twelfth pass: a third of rptest's page faults at 4 threads). */
static void decay_note_refault(uint64_t purge_age, uint64_t since, uint64_t now) {
  uint64_t idle = purge_age + since;
  uint64_t max = (uint64_t)mld_opt.dirty_decay_max_ms;
  if (idle + idle / 2 > max) return;   /* idle for longer than the longest decay covers: rightly purged */
  uint64_t want = max;
  uint64_t cur = atomic_load_explicit(&mld_decay_ext_ms, memory_order_relaxed);
  while (cur < want && !atomic_compare_exchange_weak_explicit(&mld_decay_ext_ms, &cur, want, memory_order_relaxed,
                                                              memory_order_relaxed)) {}
  atomic_store_explicit(&decay_ext_seen, now, memory_order_relaxed);
}

static bool decay_adapts(void) {
  return mld_opt.dirty_decay_ms > 0 && mld_opt.dirty_decay_max_ms > mld_opt.dirty_decay_ms;
}

/* A free span is taken at `now` (lock held): purged, a refault; dirty and older than the base decay, the lengthened
 * decay has just spared a purge and its refault, so it stays. */
static void decay_note_reuse(const page_t *pg, uint64_t now) {
  if (!decay_adapts() || !pg->dirty_since || now < pg->dirty_since) return;   /* 0: never purged by age */
  uint64_t since = now - pg->dirty_since;
  if (pg->purged) decay_note_refault(pg->purge_age, since, now);
  else if (since > mld_base_age()) atomic_store_explicit(&decay_ext_seen, now, memory_order_relaxed);
}

/* A new segment is mapped at `now` while segments unmapped by age are missing: a refault as well. */
static void decay_note_segment(uint64_t now) {
  if (!decay_adapts()) return;
  unsigned n = atomic_load_explicit(&decay_unmapped, memory_order_relaxed);
  do {
    if (!n) return;
  } while (!atomic_compare_exchange_weak_explicit(&decay_unmapped, &n, n - 1, memory_order_relaxed,
                                                  memory_order_relaxed));
  /* The time and age may come from two different unmaps racing: either is a segment purged by age, idle as long. */
  uint64_t at = atomic_load_explicit(&decay_unmap_at, memory_order_relaxed);
  if (now >= at) decay_note_refault(atomic_load_explicit(&decay_unmap_age, memory_order_relaxed), now - at, now);
}

/* A segment whose memory was purged by age at `at`, when `age` old, is unmapped. */
static void decay_note_unmap(uint64_t at, uint64_t age) {
  atomic_store_explicit(&decay_unmap_at, at, memory_order_relaxed);
  atomic_store_explicit(&decay_unmap_age, age, memory_order_relaxed);
  unsigned n = atomic_load_explicit(&decay_unmapped, memory_order_relaxed);
  while (n < DECAY_UNMAPPED_MAX && !atomic_compare_exchange_weak_explicit(&decay_unmapped, &n, n + 1,
                                                                          memory_order_relaxed, memory_order_relaxed)) {}
}

/* The decay in force at `now`, in ms: a lengthened decay goes back to dirty_decay_ms once it has neither spared nor
 * asked for memory for 4 of its own lengths (races with decay_note_reuse lose a lengthening at worst). */
long mld_decay_current(uint64_t now) {
  uint64_t e = atomic_load_explicit(&mld_decay_ext_ms, memory_order_relaxed);
  uint64_t seen = atomic_load_explicit(&decay_ext_seen, memory_order_relaxed);
  if (e && now > seen && now - seen > 4 * e) atomic_store_explicit(&mld_decay_ext_ms, 0, memory_order_relaxed);
  return mld_decay_ms();
}

/* The smallest dirty span of a's lists for `use` with at least `slots` slots, else the smallest span (lock held):
 * resident memory is reused before untouched memory is faulted in. Each list holds its dirty spans first, so its
 * head says whether it has one. *dirty: whether the span returned is dirty. */
static page_t *span_fit(arena_t *a, unsigned use, size_t slots, bool *dirty) {
  page_t *pg = NULL;
  for (size_t n = slots; n <= MLD_USABLE_SLOTS; n++) {
    page_t *h = a->spans[use][n];
    if (!h) continue;
    if (!h->purged) { *dirty = true; return h; }
    if (!pg) pg = h;
  }
  *dirty = false;
  return pg;
}

/* Another automatic arena holding a dirty span that fits, locked, with that span in *pg, or NULL (a's lock held;
 * trylock only, so no lock order between arenas is needed). Threads move between the automatic arenas as contention
 * appears, so memory one of them freed would otherwise wait for its decay while another faults in fresh pages
 * (mstress: a third more peak RSS). The span stays its segment's arena's: it goes back there when freed. Arenas
 * made by arenas.create neither lend nor borrow: a thread bound to one keeps its memory apart. */
static arena_t *borrow_dirty(arena_t *a, unsigned use, size_t slots, page_t **pg) {
  unsigned autos = mld_arenas_auto();
  if (a->index >= autos) return NULL;
  for (unsigned i = 1; i < autos; i++) {
    arena_t *b = mld_arenas[(a->index + i) % autos];
    if (pthread_mutex_trylock(&b->lock) != 0) continue;
    bool dirty;
    if (b->dirty_slots >= slots && (*pg = span_fit(b, use, slots, &dirty)) != NULL && dirty) {
      b->lock_stats.ops++;
      return b;
    }
    pthread_mutex_unlock(&b->lock);
  }
  return NULL;
}

/* A span of `slots` slots: the smallest dirty one that fits, in a or, failing that, in another automatic arena
 * (borrow_dirty), else the smallest that fits, else a new segment's; split. The span is marked `kind` before the lock
 * is released: threads freeing a neighbour read its descriptors under the lock. */
page_t *mld_arena_alloc_span_kind(arena_t *a, size_t slots, uint8_t kind, bool *zero) {
  /* Secure variant: large blocks, and small pages of each size, in segments of their own. A large block is never
   * next to a small page, and a page always comes back where a page of its size was: its guard slab where the last
   * one was (none of the two mprotect calls, to open a closed slot and guard the new end, that a span's new layout
   * costs), never where a large block left its span closed and its guard slot behind. */
  unsigned use = MLD_SPAN_USES == 1 || kind == PAGE_LARGE || slots >= MLD_SPAN_USES ? 0 : (unsigned)slots;
  arena_lock(a);
  bool dirty;
  page_t *pg = span_fit(a, use, slots, &dirty);
  page_t *lent;
  arena_t *b = dirty ? NULL : borrow_dirty(a, use, slots, &lent);
  if (b) {   /* from here on the span's arena is b: everything below (purge, protection) is done on it */
    arena_unlock(a);
    a = b;
    pg = lent;
  }
  uint64_t now = mld_now_ms();
  if (!pg) {
    segment_t *seg = segment_new(a, use);
    if (!seg) { arena_unlock(a); return NULL; }
    pg = &seg->pages[MLD_FIRST_SLOT];
    decay_note_segment(now);
  } else {
    decay_note_reuse(pg, now);
  }
  span_remove(a, pg);
  size_t n = pg->slot_count;
  if (n > slots) {
    page_t *rest = pg + slots;
    span_insert_rest(a, rest, n - slots, pg);
  }
  *zero = pg->zero;
  pg->purged = 0;
  pg->zero = 0;
  mld_span_set_used(pg, slots, kind);
  pg->guarded = 0;
#ifdef MALLARD_SECURE
  int want = kind == PAGE_LARGE ? WANT_FULL : kind == PAGE_SMALL && span_wants_guard(pg) ? WANT_TAIL : WANT_OPEN;
  prot_plan_t plan = prot_plan(pg, slots, want);
  uint64_t next_bit = 0;
  uint8_t *next_guard = kind == PAGE_SMALL && want == WANT_OPEN ? next_guard_plan(pg, &next_bit) : NULL;
#endif
  mld_arena_maybe_purge(a, now);
  arena_unlock(a);
#ifdef MALLARD_SECURE
  if (next_guard) MLD_RACE_WINDOW();   /* its bit set, the page not closed yet: another thread may take the page */
  if (next_guard && !mld_os_protect(next_guard, mld_os_page(), false)) {   /* only missing: as prot_apply does */
    arena_lock(a);
    segment_of(pg)->prot_tail &= ~next_bit;
    arena_unlock(a);
  }
  bool closed;
  if (!prot_apply(a, &plan, &closed)) {   /* unusable: back to the free spans, all of it counted as protected */
    arena_lock(a);
    segment_of(pg)->prot_full |= slot_bits(slot_index(pg), slots);
    free_span_locked(a, pg, mld_now_ms());
    arena_unlock(a);
    return NULL;
  }
  pg->guarded = want == WANT_TAIL && closed;
#endif
  return pg;
}

page_t *mld_arena_alloc_span(arena_t *a, size_t slots, bool *zero) {
  return mld_arena_alloc_span_kind(a, slots, PAGE_LARGE, zero);
}

/* Return a span and coalesce it with dirty free neighbours in its segment; the result is dirty from `now`. Purged
 * neighbours stay apart (they join at the next purge, coalesce_purged): a dirty span is then resident memory, so
 * that dirty spans are reused first means no page faults, and `dirty` counts no purged memory. */
static void free_span_locked(arena_t *a, page_t *pg, uint64_t now) {
  size_t idx = slot_index(pg), n = pg->slot_count;
  bool zero = false;
  if (idx + n < MLD_SLOTS) {
    page_t *next = pg + n;
    if (next->kind == PAGE_FREE && next->slot_count && !next->purged) {   /* a first slot of a dirty free span */
      size_t m = next->slot_count;
      span_remove(a, next);
      next->slot_count = 0;
      n += m;
    }
  }
  if (idx > MLD_FIRST_SLOT) {
    page_t *prev = pg - 1;
    prev -= prev->offset;
    if (prev->kind == PAGE_FREE && prev->slot_count && !prev->purged) {
      size_t m = prev->slot_count;
      span_remove(a, prev);
      pg->slot_count = 0;
      pg->kind = PAGE_FREE;
      pg = prev;
      n += m;
    }
  }
  span_mark_free(pg, n);
  pg->purged = 0;
  pg->zero = zero;
  pg->dirty_since = now;
  span_insert(a, pg);
  if (!a->next_purge_ms || a->next_purge_ms > now + mld_purge_age()) a->next_purge_ms = now + mld_purge_age();
}

/* The arena's lock if it is free now (no wait): for a thread holding a heap lock that has something else to do. */
bool mld_arena_trylock(arena_t *a) {
  if (pthread_mutex_trylock(&a->lock) != 0) return false;
  a->lock_stats.ops++;
  return true;
}

/* A span goes back, a's lock held (taken by free_span or mld_arena_trylock); released on return. */
void mld_arena_free_span_unlock(arena_t *a, page_t *pg) {
  uint64_t now = mld_now_ms();
  pg->user = NULL;
  free_span_locked(a, pg, now);
  mld_arena_maybe_purge(a, now);
  arena_unlock(a);
  mld_dirty_notify();
}

/* A span goes back; `closed`: the mask bits of its slots that its caller made PROT_NONE whole (secure variant). */
static void free_span(arena_t *a, page_t *pg, uint64_t closed) {
  arena_lock(a);
#ifdef MALLARD_SECURE
  segment_of(pg)->prot_full |= closed;   /* recorded before the span can coalesce or be handed out */
#else
  (void)closed;
#endif
  mld_arena_free_span_unlock(a, pg);
}

void mld_arena_free_span(arena_t *a, page_t *pg) { free_span(a, pg, 0); }

#ifdef MALLARD_SECURE
/* A freed large block's span, made PROT_NONE whole by its caller: it goes back as it is. */
void mld_arena_free_span_noaccess(arena_t *a, page_t *pg) {
  free_span(a, pg, slot_bits(slot_index(pg), pg->slot_count));
}
#endif

/* Take an abandoned page of class `cls` for heap h; the caller collects its remote frees. */
/* The head of an abandoned list is written with relaxed atomic stores (always under the lock): adopters peek at
 * it without the lock. */
static void abandoned_set_head(arena_t *a, unsigned cls, page_t *pg) { __atomic_store_n(&a->abandoned[cls], pg, __ATOMIC_RELAXED); }

page_t *mld_arena_adopt(arena_t *a, unsigned cls, heap_t *h) {
  if (!__atomic_load_n(&a->abandoned[cls], __ATOMIC_RELAXED)) return NULL;   /* peek: a miss only costs a fresh page */
  arena_lock(a);
  page_t *pg = a->abandoned[cls];
  if (pg) {
    abandoned_set_head(a, cls, pg->next);
    if (pg->next) pg->next->prev = NULL;
    pg->next = pg->prev = NULL;
    mld_page_set_owner(pg, h);
  }
  arena_unlock(a);
  if (pg) MLD_RACE_WINDOW();   /* adopted: remote frees now go to its thread_free list again */
  return pg;
}

void mld_arena_abandon(arena_t *a, page_t *pg) {
  arena_lock(a);
  atomic_store_explicit(&pg->heap, NULL, memory_order_release);
  unsigned cls = pg->size_class;
  pg->prev = NULL;
  pg->next = a->abandoned[cls];
  if (pg->next) pg->next->prev = pg;
  abandoned_set_head(a, cls, pg);
  arena_unlock(a);
  MLD_RACE_WINDOW();   /* abandoned: adopters, reapers and remote frees may take it from here on */
  /* Remote frees pushed between the owner's last collection and the abandonment asked for no reap: one is due. */
  mld_arena_want_reap(a);
}

/* A remote free into a page whose owner exited (read before the block is published): ask for a reap, so that
 * the page goes back as soon as its blocks have, not at the next purge pass that happens to be due. Lock-free;
 * the purging thread (or the arena's next operation) reaps once the sweep age has passed since the request,
 * so that a burst of such frees costs one reap. Notifies only when the request is new. */
void mld_arena_want_reap(arena_t *a) {
  /* Our push, then this load; the reaper's clear, then its walk: one of the two sees the other (seq_cst). */
  atomic_thread_fence(memory_order_seq_cst);
  if (atomic_load_explicit(&a->reap_pending, memory_order_relaxed)) return;
  atomic_store_explicit(&a->reap_since, mld_now_ms(), memory_order_relaxed);
  /* Woken whatever it waits for: a reap falls due at the sweep age, long before the decay deadline it may be waiting
   * for (mld_dirty_notify would wake only a thread waiting without one). */
  if (!atomic_exchange_explicit(&a->reap_pending, 1, memory_order_acq_rel)) mld_purge_wake();
}

/* Free abandoned pages whose blocks have all come back by remote frees (lock held). */
void mld_arena_reap_abandoned(arena_t *a, uint64_t now) {
  atomic_store_explicit(&a->reap_pending, 0, memory_order_relaxed);   /* frees pushed after this ask again */
  atomic_thread_fence(memory_order_seq_cst);
  for (unsigned c = 0; c < MLD_NUM_CLASSES; c++) {
    page_t *pg = a->abandoned[c];
    while (pg) {
      page_t *next = pg->next;
      mld_page_collect_remote(pg);
      if (pg->used == 0) {
        if (pg->prev) pg->prev->next = pg->next; else abandoned_set_head(a, c, pg->next);
        if (pg->next) pg->next->prev = pg->prev;
        pg->next = pg->prev = NULL;
        /* A page handed over parked (heap.c hand_over): nobody holds a block of it; a large block carved from the
         * span must not read as parked to its free (api.c dealloc would take the flagged detour). */
        __atomic_store_n(&pg->in_full, 0, __ATOMIC_RELAXED);
        free_span_locked(a, pg, now);
      }
      pg = next;
    }
  }
}

/* Grow a large block in place by absorbing the free span right after it. Secure variant: the guard slot moves to
 * the new end (closed before the old one is opened). */
bool mld_arena_grow_large(arena_t *a, page_t *pg, size_t new_slots) {
  size_t n = pg->slot_count;
  if (slot_index(pg) + new_slots > MLD_SLOTS) return false;
  arena_lock(a);
  page_t *next = pg + n;
  bool ok = false;
  if (next->kind == PAGE_FREE && next->slot_count >= new_slots - n) {
    size_t m = next->slot_count;
    decay_note_reuse(next, mld_now_ms());
    span_remove(a, next);
    if (m > new_slots - n) {
      page_t *rest = pg + new_slots;
      span_insert_rest(a, rest, m - (new_slots - n), next);
    }
    next->slot_count = 0;
    void *user = pg->user;
    mld_span_set_used(pg, new_slots, PAGE_LARGE);
    pg->user = user;
    ok = true;
  }
#ifdef MALLARD_SECURE
  prot_plan_t plan;
  if (ok) plan = prot_plan(pg, new_slots, WANT_FULL);
#endif
  arena_unlock(a);
#ifdef MALLARD_SECURE
  if (ok) {
    prot_plan_t close_first = plan, open_then = plan;   /* the new guard first: the block is never unguarded */
    close_first.open = NULL;
    open_then.close = NULL;
    bool closed;
    prot_apply(a, &close_first, &closed);
    if (!prot_apply(a, &open_then, &closed)) {   /* the grown part cannot be opened: give it back, still guarded */
      arena_lock(a);
      segment_of(pg)->prot_full |= slot_bits(slot_index(pg) + n - 1, new_slots - n + 1);   /* in doubt: closed */
      arena_unlock(a);
      mld_arena_shrink_large(a, pg, n);
      return false;
    }
  }
#endif
  return ok;
}

/* Give the tail of a large block back, keeping its first new_slots slots. Secure variant: the block's new last slot
 * becomes its guard slot (closed before the tail goes; the tail's old guard slot stays closed, recorded). Not through
 * prot_plan: the new guard slot lies inside the block, open by construction, so there is nothing to plan, and closing
 * it before taking the lock keeps the block guarded at every moment with one lock round. */
void mld_arena_shrink_large(arena_t *a, page_t *pg, size_t new_slots) {
  size_t n = pg->slot_count;
  if (new_slots >= n) return;
#ifdef MALLARD_SECURE
  uint8_t *guard = page_start(pg) + ((new_slots - 1) << MLD_SLOT_SHIFT);
  bool closed = mld_os_protect(guard, MLD_SLOT_SIZE, false);
#endif
  arena_lock(a);
  uint64_t now = mld_now_ms();
#ifdef MALLARD_SECURE
  segment_t *seg = segment_of(pg);
  uint64_t bit = 1ull << (slot_index(pg) + new_slots - 1);
  if (closed) seg->prot_full |= bit; else seg->prot_full &= ~bit;
#endif
  page_t *tail = pg + new_slots;
  mld_span_set_used(tail, n - new_slots, PAGE_LARGE);
  void *user = pg->user;
  mld_span_set_used(pg, new_slots, PAGE_LARGE);
  pg->user = user;
  free_span_locked(a, tail, now);
  arena_unlock(a);
  mld_dirty_notify();
}

/* ---- decay: dirty spans purged once old, abandoned pages reaped once asked for (arena lock held) ---- */

/* When the arena's pending reap is due (0: none asked): the sweep age after the request, as a sweep gives back an
 * idle owner's emptied parked pages. A parked page handed over (heap.c hand_over) is abandoned before its last blocks
 * come back: it must not wait a decay period longer than it did as its owner's. A burst of frees still costs one
 * reap per sweep age. */
static uint64_t reap_due(arena_t *a) {
  if (likely(!atomic_load_explicit(&a->reap_pending, memory_order_relaxed))) return 0;
  return atomic_load_explicit(&a->reap_since, memory_order_relaxed) + mld_sweep_age();
}

/* Reap and purge what is due (lock held); returns the bytes purged. */
size_t mld_arena_maybe_purge(arena_t *a, uint64_t now) {
  uint64_t reap = reap_due(a);
  if (unlikely(reap) && now >= reap) mld_arena_reap_abandoned(a, now);
  if (mld_opt.dirty_decay_ms < 0) return 0;
  if (a->dirty_slots && now >= a->next_purge_ms) return mld_arena_purge(a, false);
  return 0;
}

/* Join the adjacent purged free spans of a segment (lock held); returns its one free span when that is all of it
 * (purged). Purged spans take the later purge time of the two, and its age (decay_note_reuse). */
static page_t *coalesce_purged(arena_t *a, segment_t *seg) {
  for (size_t i = MLD_FIRST_SLOT; i < MLD_SLOTS;) {
    page_t *pg = &seg->pages[i];
    size_t n = pg->slot_count;   /* the first slot of a span (free or in use) holds its length */
    if (!n) return NULL;         /* not a span's first slot: nothing to trust further on */
    if (pg->kind == PAGE_FREE && pg->purged) {
      size_t first = n;
      uint64_t since = pg->dirty_since, age = pg->purge_age;
      for (page_t *next; i + n < MLD_SLOTS && (next = pg + n)->kind == PAGE_FREE && next->purged && next->slot_count;) {
        if (n == first) span_remove(a, pg);   /* relisted below at its new length */
        if (next->dirty_since > since) { since = next->dirty_since; age = next->purge_age; }
        size_t m = next->slot_count;
        span_remove(a, next);
        next->slot_count = 0;
        n += m;
      }
      if (n != first) {
        span_mark_free(pg, n);
        pg->purged = 1;
        pg->zero = 1;   /* purged memory reads back as zero */
        pg->dirty_since = since;
        pg->purge_age = age;
        span_insert(a, pg);
      }
      if (n == MLD_USABLE_SLOTS) return pg;
    }
    i += n;
  }
  return NULL;
}

/* Purge dirty spans older than the decay delay (all of them if `all`); unmap segments left entirely free. Lock held
 * on entry and on return, released while madvise runs: the spans due are first taken out of the free lists and
 * marked PAGE_PURGING (no thread takes, grows into or joins them; a.purging lists them for a fork child), then
 * purged without the lock, then listed again, purged, and joined with their purged neighbours. A thread that needs
 * the arena meanwhile does not wait for the system calls (nor move to another arena because it waited).
 * A span whose madvise fails goes back dirty (its memory is neither released nor known to be zero), retried later. */
size_t mld_arena_purge(arena_t *a, bool all) {
  uint64_t now = mld_now_ms();
  uint64_t decay = mld_age_of(mld_decay_current(now));
  size_t bytes = 0;
  page_t *batch = NULL;     /* the spans taken out by this pass (PAGE_PURGING), on a->purging */
  uint64_t next_due = 0;
  mld_arena_reap_abandoned(a, now);
  a->npurge_passes++;
  for (unsigned use = 0; use < MLD_SPAN_USES; use++) {
    for (size_t n = 1; n <= MLD_USABLE_SLOTS; n++) {
      for (page_t *pg = a->spans[use][n]; pg; ) {
        page_t *next = pg->next;
        if (pg->purged) break;   /* each list holds its dirty spans first */
        if (all || now - pg->dirty_since >= decay) {
          span_remove(a, pg);
          pg->kind = PAGE_PURGING;   /* its last slot stays PAGE_FREE with slot_count 0: never a span's start */
          pg->prev = NULL;
          pg->next = a->purging;
          if (a->purging) a->purging->prev = pg;
          a->purging = pg;
          if (!batch) batch = pg;    /* this pass's spans are the run from a->purging to `batch` (pushed in front) */
        } else if (!next_due || pg->dirty_since + decay < next_due) {
          next_due = pg->dirty_since + decay;
        }
        pg = next;
      }
    }
  }
  a->next_purge_ms = next_due;   /* the spans left; a span freed while the lock is out brings its own deadline */
  if (!batch) return 0;
  page_t *first = a->purging;
  arena_unlock(a);
  /* No lock: the spans from `first` to `batch` are this pass's alone, and their links to each other too (another
   * pass pushes its spans in front, or takes them out, as a run of its own). Their `zero` byte records the outcome:
   * no other thread reads a PAGE_PURGING span's fields but its kind and slot_count. */
  MLD_RACE_WINDOW();
  size_t calls = 0;
  for (page_t *pg = first;; pg = pg->next) {
    pg->zero = mld_os_purge(page_start(pg), (size_t)pg->slot_count << MLD_SLOT_SHIFT);
    calls++;
    if (pg == batch) break;
  }
  bool contended = mld_tls_contended;
  arena_lock(a);
  mld_tls_contended = contended;   /* waiting here says nothing of the thread's arena: it is not a reason to move */
  now = mld_now_ms();
  a->nmadvise += calls;
  uint64_t retry = 0;       /* when spans whose madvise failed are due again */
  segment_t *todo = NULL;   /* segments where this pass purged a span */
  for (page_t *pg = first, *nx;; pg = nx) {
    bool last = pg == batch;
    nx = pg->next;
    if (pg->prev) pg->prev->next = pg->next; else a->purging = pg->next;
    if (pg->next) pg->next->prev = pg->prev;
    size_t n = pg->slot_count, len = n << MLD_SLOT_SHIFT;
    pg->kind = PAGE_FREE;
    if (pg->zero) {
      a->purged_bytes_total += len;
      bytes += len;
      pg->purged = 1;
      pg->purge_age = now - pg->dirty_since;
      pg->dirty_since = all ? 0 : now;   /* purged by age: when (decay_note_reuse); on request: 0 */
      segment_t *seg = segment_of(pg);
      if (!seg->purged_listed) {   /* its purged spans join after the pass (coalesce_purged) */
        seg->purged_listed = 1;
        seg->purged_next = todo;
        todo = seg;
      }
    } else {
      pg->purged = 0;   /* still dirty since it was: due again one decay from now */
      retry = now + (decay ? decay : 1);
    }
    span_insert(a, pg);
    if (last) break;
  }
  if (retry && (!a->next_purge_ms || retry < a->next_purge_ms)) a->next_purge_ms = retry;
  for (segment_t *seg = todo, *nseg; seg; seg = nseg) {
    nseg = seg->purged_next;
    seg->purged_listed = 0;
    page_t *whole = coalesce_purged(a, seg);
    if (!whole || mld_opt.retain) continue;
    /* purged by age: a segment mapped again soon after is a refault (decay_note_segment) */
    if (whole->dirty_since) decay_note_unmap(whole->dirty_since, whole->purge_age);
    mld_segment_release(a, seg);
  }
  return bytes;
}

/* The earliest time something of the arena falls due (a reap asked for, dirty spans); 0 when nothing waits.
 * `dirty` is set when dirty spans wait (even with no deadline yet). Takes the arena lock. */
uint64_t mld_arena_next_due(arena_t *a, bool *dirty) {
  mld_lock(&a->lock, &a->lock_stats);
  uint64_t best = reap_due(a);   /* abandoned pages may be empty: reap them within the sweep age */
  if (best) *dirty = true;
  if (a->dirty_slots) {
    uint64_t d = a->next_purge_ms;
    if (d && (!best || d < best)) best = d;
    *dirty = true;
  }
  pthread_mutex_unlock(&a->lock);
  return best;
}

/* An arena's counters as the report shows them (this process's, under the arena lock). */
void mld_arena_snapshot_of(const arena_t *a, arena_snapshot_t *s) {
  s->nthreads = a->nthreads;
  s->nthreads_total = a->nthreads_total;
  s->nsegments = a->nsegments;
  s->dirty_bytes = (uint64_t)a->dirty_slots * MLD_SLOT_SIZE;
  s->purged_bytes = (uint64_t)a->purged_slots * MLD_SLOT_SIZE;
  s->large_active = a->large_active;
  s->npurge_passes = a->npurge_passes;
  s->nmadvise = a->nmadvise;
  s->purged_total = a->purged_bytes_total;
  s->lock = a->lock_stats;
}

/* Copy an arena's counters under its lock. */
bool mld_arena_snapshot(unsigned index, arena_snapshot_t *s) {
  arena_t *a = mld_arena_get(index);
  if (!a) return false;
  mld_lock(&a->lock, &a->lock_stats);
  mld_arena_snapshot_of(a, s);
  pthread_mutex_unlock(&a->lock);
  return true;
}
