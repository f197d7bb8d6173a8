/* core/heap.c — thread-local heaps: the malloc slow path, page lists per size class, remote frees, thread exit and adoption. */
#define _GNU_SOURCE
#include "core/core.h"
#include "core/secure.h"
#include <errno.h>
#include <string.h>

/* Every thread starts on this shared empty heap; its first malloc creates a real one. */
heap_t mld_heap_empty = { .current = { [0 ... MLD_NUM_CLASSES - 1] = &mld_page_empty } };
/* The countdown starts negative: a thread's first allocation, malloc(0) included, takes its slow path (which
 * draws it, and under junk:alloc fills; prof.h). */
__thread mld_tls_t mld_tls __attribute__((tls_model("initial-exec"))) = { &mld_heap_empty, (uint64_t)-1 };

pthread_mutex_t mld_heaps_mutex = PTHREAD_MUTEX_INITIALIZER;
heap_t *mld_heaps_all;                  /* live heaps (statistics, fork) */
static heap_t *heaps_pool;              /* heap structs of abandoned heaps, reused */
/* Heaps of exited threads kept whole, most recent first (mld_heap_exit): the next thread to start takes one over with
 * its pages, so the blocks its predecessor handed on are its own (owner frees, no adoption). A sweep abandons those
 * left unclaimed for a decay period. Under mld_heaps_mutex. */
static heap_t *orphans;
heap_stats_t mld_dead_stats;            /* counters of exited threads, folded in when they exit */
heap_stats_t mld_orphan_stats;          /* counters of frees by threads that never allocated */
__thread bool mld_tls_contended __attribute__((tls_model("initial-exec")));   /* set when this thread waited for an arena lock */
_Atomic(unsigned) mld_arena_cap;          /* mallopt(M_ARENA_MAX): threads spread over at most this many (0: all) */
__thread bool mld_tls_exiting __attribute__((tls_model("initial-exec")));     /* set by the heap's TLS destructor */

/* ---- page lists ---- */
static void list_remove(page_list_t *l, page_t *pg) {
  if (pg->prev) pg->prev->next = pg->next; else l->head = pg->next;
  if (pg->next) pg->next->prev = pg->prev; else l->tail = pg->prev;
  pg->next = pg->prev = NULL;
}
static void list_push_head(page_list_t *l, page_t *pg) {
  pg->prev = NULL;
  pg->next = l->head;
  if (l->head) l->head->prev = pg; else l->tail = pg;
  l->head = pg;
}
static void list_push_tail(page_list_t *l, page_t *pg) {
  pg->next = NULL;
  pg->prev = l->tail;
  if (l->tail) l->tail->next = pg; else l->head = pg;
  l->tail = pg;
}
/* The list's pages from its head through `last` move, in their order, to its tail: O(1), however many. */
static void list_rotate_through(page_list_t *l, page_t *last) {
  if (last == l->tail) return;   /* the whole list: already in that order */
  page_t *first = l->head, *rest = last->next;
  rest->prev = NULL;
  l->head = rest;
  l->tail->next = first;
  first->prev = l->tail;
  last->next = NULL;
  l->tail = last;
}

/* in_full is read by threads sending remote frees (outbox.c): written atomically, always under the heap lock. */
static void set_in_full(page_t *pg, uint8_t v) { __atomic_store_n(&pg->in_full, v, __ATOMIC_RELAXED); }

/* A page with nothing free leaves the class list for the full list until remote frees arrive. From now on
 * the owner's frees into it take the locked path (mld_free_parked), so a sweep may give it back. */
static void park(heap_t *h, unsigned c, page_t *pg) {
  if (h != &mld_exit_heap) h->stats.pages_parked++;   /* the exit heap's counters are summed nowhere */
  set_in_full(pg, 1);
  pg->dry_seen = 0;   /* back on the class list, a page starts again with one turn at its tail */
  list_push_tail(&h->full[c], pg);
  /* Remote frees published before in_full was set asked for no sweep: one is due if any waits now. A send that
   * read its notice before in_full was set and publishes after this check asks for none either: that page waits
   * for the next send into it, a refill of its class, a trim or the thread's exit (docs/DESIGN.md, "Memory
   * ordering of the hand-offs"). */
  atomic_thread_fence(memory_order_seq_cst);
  if (mld_page_remote_waiting(pg)) mld_sweep_want();
}

/* Make pg the class's current page. keep_on_empty caches "current and not to be asked on empty" for the
 * owner's free fast path (one byte test instead of a current[] load and a keep_check test). */
static void make_current(heap_t *h, unsigned c, page_t *pg) {
  page_t *old = h->current[c];
  if (old != pg && old != &mld_page_empty) {
    old->keep_on_empty = 0;
    /* Sends into it asked for no sweep while it was current, later ones will (outbox.c): one is due if any waits
     * (a page just parked was checked by park; a send that read "current" before the store and publishes after
     * this load asks for none: the bound of park's comment). The store, then the load: a full barrier (xchg). */
    __atomic_exchange_n(&old->is_current, 0, __ATOMIC_SEQ_CST);
    if (!old->in_full && mld_page_remote_waiting(old)) mld_sweep_want();
  }
  if (pg != &mld_page_empty) {
    pg->keep_on_empty = !pg->keep_check;
    __atomic_store_n(&pg->is_current, 1, __ATOMIC_RELAXED);
  }
  h->current[c] = pg;
}

static void set_current(heap_t *h, unsigned c) {
  make_current(h, c, h->avail[c].head ? h->avail[c].head : &mld_page_empty);
}

/* ---- heap life ---- */
static heap_t *find_dead_heap(void);
static heap_t *take_orphan(const heap_t *prefer);
static void take_over_orphan_pages(heap_t *h);
#ifndef MALLARD_SECURE
static void bcache_reset(heap_t *h);
#endif

/* The calling thread's heap from now on (a fresh one, or an orphan taken over), registered already. */
static heap_t *heap_attach(heap_t *h) {
#ifndef MALLARD_SECURE
  bcache_reset(h);   /* a fresh heap, or an orphan whose cache its last owner emptied */
#endif
  mld_tls_heap = h;                       /* before setspecific: it may allocate, and must find this heap */
  pthread_setspecific(mld_heap_key, h);
  mld_purge_new_heap();                   /* a fork child's own new thread allows the purging thread again */
  return h;
}

/* The heap's robust `life` mutex, made anew, unlocked. */
static void life_init(heap_t *h) {
  pthread_mutexattr_t ra;
  pthread_mutexattr_init(&ra);
  pthread_mutexattr_setrobust(&ra, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(&h->life, &ra);
  pthread_mutexattr_destroy(&ra);
}
/* The calling thread takes its heap's robust `life` mutex for good: released by its destructor
 * (mld_heap_abandon, mld_heap_exit), or marked EOWNERDEAD by the kernel when the thread ends without one. Lock
 * order: a `life` before the heaps' lock (a thread holds its own for good and takes the heaps' lock), so no `life` is
 * ever taken with the heaps' lock held. */
static void life_begin(heap_t *h) {
  life_init(h);
  pthread_mutex_lock(&h->life);
}
/* dst += src, counter by counter; src may be updated meanwhile by its owner (relaxed loads: a snapshot). */
void mld_stats_add(heap_stats_t *dst, const heap_stats_t *src) {
  const uint64_t *s = (const uint64_t *)src;
  uint64_t *d = (uint64_t *)dst;
  for (size_t i = 0; i < sizeof(heap_stats_t) / sizeof(uint64_t); i++) d[i] += __atomic_load_n(&s[i], __ATOMIC_RELAXED);
}

/* The calling thread's heap, made on first use; NULL when none can be made (no memory, or the thread is past its
 * heap's TLS destructor: a heap made now might never be abandoned, so such a thread uses the exit heap). */
heap_t *mld_heap_get(void) { return mld_heap_get_near(NULL); }

/* The same, for a thread whose first call frees a block of `prefer`'s (mld_free_remote): if that heap is an orphan,
 * it is the one taken over, whichever orphan is newest. A successor that starts by freeing what its predecessor
 * handed it (larson) then owns those blocks even when another thread exited in between (larson/t4: 134 of 211
 * take-overs found their predecessor's heap this way, remote frees 525k -> 451k). */
heap_t *mld_heap_get_near(const heap_t *prefer) {
  heap_t *h = mld_tls_heap;
  if (h != &mld_heap_empty) return h;
  if (mld_tls_exiting) return NULL;
  mld_ensure_init();
  /* Arena 0 may be missing when memory ran out during initialisation: every heap needs it. */
  if (!mld_arena_get(0) && mld_arena_create() < 0) return NULL;
  for (heap_t *dead; (dead = find_dead_heap()) != NULL;) mld_heap_abandon(dead);   /* their structs are reused */
  if ((h = take_orphan(prefer)) != NULL) return h;
  pthread_mutex_lock(&mld_heaps_mutex);
  h = heaps_pool;
  if (h) heaps_pool = h->next_free;
  pthread_mutex_unlock(&mld_heaps_mutex);
  if (!h) h = mld_meta_alloc(sizeof(heap_t));
  if (!h) return NULL;
  /* Made ready, `life` held, before it is registered (a sweep may look at it from then on): no other lock is
   * held while `life` is taken, which is then held for the thread's whole life. */
  /* A thread sending remote frees may still read last_slow_ms and write reclaim_wanted of a struct recycled since it
   * read its page's owner (outbox.c remote_notify: one walk in vain): those two are reset with atomics, not memset. */
  _Static_assert(offsetof(heap_t, reclaim_wanted) == offsetof(heap_t, last_slow_ms) + 8 &&
                 offsetof(heap_t, reclaim_ms) <= offsetof(heap_t, reclaim_wanted) + 8, "nothing else between the two");
  memset(h, 0, offsetof(heap_t, last_slow_ms));
  atomic_store_explicit(&h->last_slow_ms, 0, memory_order_relaxed);
  atomic_store_explicit(&h->reclaim_wanted, 0, memory_order_relaxed);
  memset((char *)h + offsetof(heap_t, reclaim_ms), 0, sizeof *h - offsetof(heap_t, reclaim_ms));
  for (unsigned c = 0; c < MLD_NUM_CLASSES; c++) h->current[c] = &mld_page_empty;
  atomic_store_explicit(&h->lock, 0, memory_order_relaxed);
  life_begin(h);
  atomic_store_explicit(&h->last_slow_ms, mld_now_ms(), memory_order_relaxed);
  pthread_mutex_lock(&mld_heaps_mutex);
  /* Every thread starts on arena 0, so a quiet process shares its segments (no reservation per thread);
   * a thread that waits for an arena lock moves on to the next automatic arena (mld_heap_arena). */
  h->arena = mld_arenas[0];
  h->arena->nthreads++;
  h->arena->nthreads_total++;
  h->thread = pthread_self();
  h->live = true;
  h->next_all = mld_heaps_all;
  if (mld_heaps_all) mld_heaps_all->prev_all = h;
  mld_heaps_all = h;
  pthread_mutex_unlock(&mld_heaps_mutex);
  return heap_attach(h);
}

/* The calling thread takes over `prefer` if it is an orphan, else the most recent orphan; NULL when there is none.
 * Everything of the heap stays as its last owner left it (its outbox was flushed, its counters folded into the dead
 * threads' record and zeroed):
 * pages, lists, `current`, cache; every page still names it, so the blocks the predecessor handed on are freed on the
 * owner's fast path. Other threads' remote frees into its pages waited on their thread_free lists meanwhile: the new
 * owner collects them as it refills, like any owner. Its arena stays (the arena it had moved to under contention). */
static heap_t *take_orphan(const heap_t *prefer) {
  pthread_mutex_lock(&mld_heaps_mutex);
  heap_t **pp = &orphans;
  if (prefer) {   /* compared, never read: it may be any heap, live or recycled, by now */
    while (*pp && *pp != prefer) pp = &(*pp)->next_free;
    if (!*pp) pp = &orphans;
  }
  heap_t *h = *pp;
  if (h) {
    *pp = h->next_free;
    h->next_free = NULL;
  }
  pthread_mutex_unlock(&mld_heaps_mutex);
  if (!h) return NULL;
  /* Out of the list, still marked an orphan (find_dead_heap skips it): its `life` is ours to make and take, with no
   * lock held (the lock order of life_begin). */
  life_begin(h);
  pthread_mutex_lock(&mld_heaps_mutex);
  h->orphan_ms = 0;
  atomic_store_explicit(&h->last_slow_ms, mld_now_ms(), memory_order_relaxed);
  h->arena->nthreads++;
  h->arena->nthreads_total++;
  h->thread = pthread_self();
  h->live = true;
  pthread_mutex_unlock(&mld_heaps_mutex);
  MLD_RACE_WINDOW();   /* taken over: remote frees into its pages and sweeps of it go on meanwhile */
  /* Its pages as the new owner starts: remote frees collected, empty pages carved afresh (mld_page_restart: the
   * predecessor that freed everything before exiting, as a pool's worker does, left random free lists), parked
   * pages with room back on their class lists. Under the heap lock: a sweep may be at its parked pages. */
  mld_spin_lock(&h->lock);
  take_over_orphan_pages(h);
  mld_spin_unlock(&h->lock);
  return heap_attach(h);
}

/* The heap's arena for its next span. A thread whose last arena operation had to wait for the lock moves to
 * the next automatic arena: threads spread over the arenas as contention appears, and only then. */
arena_t *mld_heap_arena(heap_t *h) {
  if (unlikely(h == &mld_heap_empty)) return mld_arena_get(0);   /* a thread past its heap (exit heap, large blocks) */
  if (unlikely(mld_tls_contended)) {
    mld_tls_contended = false;
    unsigned autos = mld_arenas_auto();
    if (!h->bound && autos > 1) {
      arena_t *next = mld_arenas[(h->arena->index + 1) % autos];
      pthread_mutex_lock(&mld_heaps_mutex);
      h->arena->nthreads--;
      h->arena = next;
      next->nthreads++;
      next->nthreads_total++;
      pthread_mutex_unlock(&mld_heaps_mutex);
    }
  }
  return h->arena;
}

bool mld_heap_bind_arena(heap_t *h, unsigned index) {
  arena_t *a = mld_arena_get(index);
  if (!a) return false;
  pthread_mutex_lock(&mld_heaps_mutex);
  h->arena->nthreads--;
  h->arena = a;
  a->nthreads++;
  a->nthreads_total++;
  h->bound = true;
  pthread_mutex_unlock(&mld_heaps_mutex);
  return true;
}

#ifdef MALLARD_SECURE
/* An empty page has no live block and none waiting as a remote free: the bits of both bitmaps are all clear (a
 * bookkeeping check). Bits are only ever left set at the starts of carved blocks (a free of any other address is
 * reported before its page can empty: secure_owner_release, the collection), so the words checked are those of
 * the carved blocks' starts: every word of the carved bytes for blocks under 1 KiB (a word covers 1 KiB), the
 * word of each block's start above (a 1 MiB page of 256 KiB blocks: 4 words, not 1024). */
static void secure_check_empty(const page_t *pg) {
  uint8_t *start = page_start(pg);
  size_t bs = pg->block_size, carved = (size_t)pg->capacity * bs, step = bs > 1024 ? bs : 1024;
  for (size_t off = 0; off < carved; off += step) {
    uint64_t *live = bm_word(start + off);
    if (bm_load(live) | bm_load(bm_remote_word(live))) mld_secure_fail("live block in a page being released:", start + off);
  }
}
#endif

/* A page leaves a heap: its class's release count in `st` (the heap's own, or the shared record for a thread that is not
 * the owner), so that curpages (pages taken less pages released) counts the pages heaps hold. A page abandoned to its
 * arena counts as released here and as taken again by its adopter (adopt_page): abandoned pages that a reap gives back
 * empty were counted held for ever (larson/t4: four times the pages the classes held). Under the heap lock, but
 * possibly by a sweep abandoning a dead thread's heap while mld_stats_sum reads it (relaxed loads): a relaxed load
 * and store, so that the reader's snapshot is a race-free one. */
static void count_released(heap_stats_t *st, const page_t *pg) {
  uint64_t *rel = &st->cls[pg->size_class].npages_released;
  if (st == &mld_orphan_stats) __atomic_fetch_add(rel, 1, __ATOMIC_RELAXED);
  else __atomic_store_n(rel, __atomic_load_n(rel, __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED);
}

/* A page still holding blocks leaves its heap for its arena's abandoned list (a thread's exit, a hand-over, a take from
 * an idle owner): every such path counts its release here, in the shared record (the caller may not be the owner),
 * and its adopter counts it taken again (adopt_page). Returns the arena. */
static arena_t *abandon_to_arena(page_t *pg) {
  arena_t *a = segment_of(pg)->arena;
  count_released(&mld_orphan_stats, pg);
  mld_arena_abandon(a, pg);   /* `heap` NULL with release */
  return a;
}

/* An empty page leaves the heap's lists: no block of it is live, nobody frees into it any more. */
static void page_leave(heap_t *h, page_t *pg) {
#ifdef MALLARD_SECURE
  secure_check_empty(pg);
#endif
  count_released(&h->stats, pg);
  atomic_store_explicit(&pg->heap, NULL, memory_order_relaxed);
}

/* The same, by a thread that may not be the page's owner (a sweep, a claim): counted in the shared record, since the
 * owner writes its own counters without the lock. */
static void page_leave_shared(page_t *pg) {
#ifdef MALLARD_SECURE
  secure_check_empty(pg);
#endif
  count_released(&mld_orphan_stats, pg);
  atomic_store_explicit(&pg->heap, NULL, memory_order_relaxed);
}

/* Does every block of pg that is handed out wait as a published remote free, or in the caller's unpublished batch of
 * `batch` blocks (pg's heap lock held)? Then its owner holds none: the proof is sweep_unparked's. */
static bool all_out_waiting(const page_t *pg, size_t batch) {
  size_t n = mld_page_remote_published(pg) + batch;
  return n != 0 && n == __atomic_load_n(&pg->used, __ATOMIC_ACQUIRE);
}

static void page_release(heap_t *h, page_t *pg) {
  page_leave(h, pg);
  mld_arena_free_span(segment_of(pg)->arena, pg);
}

/* An empty page leaves the class lists: keep it in the page cache while the cache holds fewer than
 * page_cache slots in all, else give it back to its arena. */
static void page_release_or_cache(heap_t *h, page_t *pg) {
  if (h->ncache + pg->slot_count <= mld_opt.page_cache && segment_of(pg)->arena == h->arena) {
    page_leave(h, pg);
    pg->next = h->cache;
    h->cache = pg;
    h->ncache += pg->slot_count;
    return;
  }
  page_release(h, pg);
}

/* A cached page of exactly `slots` slots, or NULL. */
static page_t *cache_take(heap_t *h, unsigned slots) {
  for (page_t **pp = &h->cache; *pp; pp = &(*pp)->next) {
    page_t *pg = *pp;
    if (pg->slot_count == slots) {
      *pp = pg->next;
      pg->next = NULL;
      h->ncache -= slots;
      return pg;
    }
  }
  return NULL;
}

static void cache_flush(heap_t *h) {
  while (h->cache) {
    page_t *pg = h->cache;
    h->cache = pg->next;
    pg->next = NULL;
    mld_arena_free_span(segment_of(pg)->arena, pg);
  }
  h->ncache = 0;
}

/* Visit every page of a class (class list, then full list); the visitor may unlink or release the page, or move it
 * from the full list to the tail of the class list (not visited twice: the class list was walked first). */
typedef void (*page_visit_t)(heap_t *h, unsigned c, page_list_t *list, page_t *pg, bool force);
static size_t visit_pages(heap_t *h, page_visit_t visit, bool force) {   /* returns the pages visited */
  size_t n = 0;
  for (unsigned c = 0; c < MLD_NUM_CLASSES; c++) {
    page_list_t *lists[2] = { &h->avail[c], &h->full[c] };
    for (int k = 0; k < 2; k++) {
      for (page_t *pg = lists[k]->head, *next; pg; pg = next) {
        next = pg->next;
        visit(h, c, lists[k], pg, force);
        n++;
      }
    }
    set_current(h, c);
  }
  return n;
}

/* Thread exit: an empty page goes back to its arena, the others are abandoned for adoption. */
static void abandon_page(heap_t *h, unsigned c, page_list_t *list, page_t *pg, bool force) {
  (void)force;
  list_remove(list, pg);
  set_current(h, c);   /* never leave current[c] on a page that is being given away */
  set_in_full(pg, 0);
  mld_page_collect(pg);
  if (pg->used == 0) page_release(h, pg);
  else abandon_to_arena(pg);
}

/* Collection: empty pages leave (the current one too when forced); full pages with frees return to the list. */
static void collect_page(heap_t *h, unsigned c, page_list_t *list, page_t *pg, bool force) {
  mld_page_collect(pg);
  if (pg->used == 0 && (force || pg != h->avail[c].head)) {
    list_remove(list, pg);
    set_current(h, c);   /* before the release: nothing may allocate from a page that went back to its arena */
    page_release(h, pg);
  } else if (pg->in_full && pg->free) {
    list_remove(list, pg);
    set_in_full(pg, 0);
    list_push_tail(&h->avail[c], pg);
  }
}

/* Take-over: remote frees collected, an empty page carved afresh (mld_page_restart), a parked page with room back on
 * its class list. */
static void take_over_page(heap_t *h, unsigned c, page_list_t *list, page_t *pg, bool force) {
  (void)force;
  mld_page_collect(pg);
  if (pg->used == 0) mld_page_restart(pg);
  if (pg->in_full && (pg->free || pg->used == 0)) {
    list_remove(list, pg);
    set_in_full(pg, 0);
    list_push_tail(&h->avail[c], pg);
  }
}
static void take_over_orphan_pages(heap_t *h) {
  visit_pages(h, take_over_page, false);   /* its page cache stays: a cached page is initialised when taken */
}

#ifndef MALLARD_SECURE
/* ---- the thread cache (option tcache; api.c's fast paths): per class, a stack of blocks the owner freed ----
 * malloc pops the block freed last, still in the CPU's cache, where a page's list hands out blocks freed long ago
 * (larson: a cache miss per malloc; docs/PERFORMANCE.md, issue 39's thirty-ninth pass). A stack of pointers in the
 * heap (jemalloc's cache bins), not a list through the blocks: a push writes nothing into the block, a pop reads
 * nothing of it, and a full or empty class costs a compare, no write (forty-second pass). A cached block stays
 * counted in its page's `used`, so no claim, hand-over, sweep or release sees it as free; only the owner touches the
 * stack. Every small class has one (a class without would make the fast paths' branches follow the random class of
 * each call); at most MLD_BCACHE_BLOCKS blocks and MLD_BCACHE_BYTES bytes a class, so that an idle thread pins little. */
static uint32_t bcache_limit(unsigned c) {
  uint32_t s = mld_class_size[c];
  if (!mld_opt.tcache || s > MLD_BCACHE_CLASS_MAX) return 0;
  uint32_t n = MLD_BCACHE_BYTES / s;
  return n > MLD_BCACHE_BLOCKS ? MLD_BCACHE_BLOCKS : n;
}
static inline uint32_t bstack_low(void **p) { return (uint32_t)(uintptr_t)p; }
/* Class c's stack over slots [base, base + n): empty (top at its end). n == 0: no cache, always empty and full. */
static void bstack_set(heap_t *h, unsigned c, void **base, uint32_t n) {
  h->btop[c] = base + n;
  h->bbound[c].empty = bstack_low(base + n);
  h->bbound[c].full = bstack_low(base);
}
/* The block freed last of class c, taken off its stack; NULL when it is empty. */
static void *bstack_pop(heap_t *h, unsigned c) {
  if (bstack_low(h->btop[c]) == h->bbound[c].empty) return NULL;
  return *h->btop[c]++;
}
static inline void bcache_unfree(heap_t *h, unsigned c) {
#ifdef MALLARD_STATS
  h->stats.cls[c].nfree--;   /* counted when it entered the cache; the path below counts it again */
#else
  (void)h; (void)c;
#endif
}
/* One cached block back to its page by its owner h (the calling thread's heap: mld_free_parked and mld_free_remote
 * act for it): the free the fast path did before the cache, each of whose paths counts it again. */
static void bcache_return(heap_t *h, block_t *b) {
  page_t *pg = page_of(segment_of(b), b);
  bcache_unfree(h, pg->size_class);
  atomic_store_explicit(&h->hazard, b, memory_order_release);
  atomic_signal_fence(memory_order_seq_cst);
  if (__atomic_load_n(&pg->in_full, __ATOMIC_ACQUIRE)) { mld_free_parked(b); return; }
  if (atomic_load_explicit(&pg->heap, memory_order_relaxed) != h) { mld_free_remote(pg, b); return; }
  mld_owner_push(pg, b);
  if (mld_used_release_dec(pg) == 0 && !pg->keep_on_empty) mld_page_retire_owner(h, pg);
}
/* The cache at a thread's start or take-over: every class's stack empty, laid out in h->bslots class after class. */
static void bcache_reset(heap_t *h) {
  uint32_t off = 0;
  for (unsigned c = 0; c < MLD_NUM_CLASSES; c++) {
    uint32_t n = bcache_limit(c);
    if (n > MLD_BCACHE_SLOTS - off) n = MLD_BCACHE_SLOTS - off;   /* never past bslots (MLD_BCACHE_SLOTS covers all) */
    bstack_set(h, c, h->bslots + off, n);
    off += n;
  }
}
/* Every cached block back, by the owner (collection: mallard_collect, thread.tcache.flush, malloc_trim). Each block
 * leaves its stack before it goes back (bcache_return may free into a parked page, which takes locks, never the cache). */
static void bcache_flush_all(heap_t *h) {
  for (unsigned c = 0; c < MLD_NUM_CLASSES; c++) {
    block_t *b;
    while ((b = bstack_pop(h, c)) != NULL) bcache_return(h, b);
  }
}
/* Every cached block of h back, by the thread that leaves h (its owner at exit, or the thread that abandons a dead
 * one), under h's lock, which keeps sweeps, claims and hand-overs out of h's pages: into h's own pages, parked ones too
 * (abandonment and take-over deal with their free blocks), and a page handed to another heap meanwhile gets its block
 * as a remote free published at once (no outbox: the caller may have no heap, or be past its destructor). The frees
 * were counted when the blocks entered the cache. Every class is left without a cache until a thread takes the heap
 * over (heap_attach). */
static void bcache_drop_all(heap_t *h) {
  mld_spin_lock(&h->lock);
  for (unsigned c = 0; c < MLD_NUM_CLASSES; c++) {
    block_t *b;
    while ((b = bstack_pop(h, c)) != NULL) {
      page_t *pg = page_of(segment_of(b), b);
      if (atomic_load_explicit(&pg->heap, memory_order_relaxed) == h) {
        bcache_unfree(h, pg->size_class);   /* mld_owner_push counts it again */
        mld_owner_push(pg, b);
        mld_used_release_dec(pg);
      } else {
        MLD_STAT_ADD(h, remote_frees, 1);
        mld_remote_push(pg, b, b, 1);
      }
    }
    bstack_set(h, c, h->bslots, 0);
  }
  mld_spin_unlock(&h->lock);
}
#endif

/* A thread is exiting (or, from a sweep, has ended without its destructor): its pending remote frees are sent,
 * its pages released or abandoned, its counters kept, its struct recycled. The caller holds `life`. */
void mld_heap_abandon(heap_t *h) {
#ifndef MALLARD_SECURE
  bcache_drop_all(h);
#endif
  mld_outbox_flush(h);
  mld_spin_lock(&h->lock);
  visit_pages(h, abandon_page, true);
  cache_flush(h);
  mld_spin_unlock(&h->lock);
  pthread_mutex_lock(&mld_heaps_mutex);
  mld_stats_add(&mld_dead_stats, &h->stats);
  if (h->live) h->arena->nthreads--;      /* an orphan's thread left its arena when it exited */
  h->live = false;
  if (h->prev_all) h->prev_all->next_all = h->next_all; else mld_heaps_all = h->next_all;
  if (h->next_all) h->next_all->prev_all = h->prev_all;
  pthread_mutex_unlock(&h->life);         /* before the struct can be reused (and its mutexes made anew) */
  h->next_free = heaps_pool;
  heaps_pool = h;
  pthread_mutex_unlock(&mld_heaps_mutex);
}

/* The thread of h is exiting (its TLS destructor). Its heap becomes an orphan, whole, for the next thread that starts
 * (take_orphan): a thread that hands its live blocks to a successor, and a pool that replaces its threads, cost no
 * abandonment, no adoption and no remote frees. Only its pending batches are sent now (they are other pages'), and
 * its counters folded into the dead threads' record (a successor's own counters start at zero). A sweep is asked
 * for: an orphan nobody claims within a decay period is abandoned then (mld_heaps_sweep), so its memory comes back.
 * A heap bound to an arena by its thread is abandoned at once: the binding was that thread's choice. */
void mld_heap_exit(heap_t *h) {
  if (h->bound) { mld_heap_abandon(h); return; }
#ifndef MALLARD_SECURE
  bcache_drop_all(h);   /* an orphan's cached blocks would keep pages its successor empties */
#endif
  mld_outbox_flush(h);
  MLD_RACE_WINDOW();   /* leaving: other threads free into its pages, a sweep may visit it meanwhile */
  uint64_t now = mld_now_ms();
  pthread_mutex_lock(&mld_heaps_mutex);
  mld_stats_add(&mld_dead_stats, &h->stats);
  memset(&h->stats, 0, sizeof h->stats);
  h->arena->nthreads--;
  h->live = false;
  h->orphan_ms = now ? now : 1;
  pthread_mutex_unlock(&h->life);         /* the next owner makes it anew (life_begin) */
  h->next_free = orphans;
  orphans = h;
  pthread_mutex_unlock(&mld_heaps_mutex);
  mld_sweep_want();
}

/* An orphan unclaimed for `age` ms (any, when forced), taken out of the list with its `life` held, for
 * mld_heap_abandon; NULL when none. *young is set when younger orphans remain. */
static heap_t *take_stale_orphan(uint64_t now, uint64_t age, bool force, bool *young) {
  pthread_mutex_lock(&mld_heaps_mutex);
  heap_t *o = NULL;
  for (heap_t **pp = &orphans; *pp; pp = &(*pp)->next_free) {
    uint64_t since = (*pp)->orphan_ms;
    if (force || (since <= now && now - since >= age)) {
      o = *pp;
      *pp = o->next_free;
      o->next_free = NULL;
      break;
    }
    *young = true;
  }
  pthread_mutex_unlock(&mld_heaps_mutex);
  if (!o) return NULL;
  /* Out of the list, still marked (find_dead_heap skips it): its `life`, uncontended, taken with no lock held (the
   * order of life_begin); mld_heap_abandon releases it. */
  pthread_mutex_lock(&o->life);
  pthread_mutex_lock(&mld_heaps_mutex);
  o->orphan_ms = 0;
  pthread_mutex_unlock(&mld_heaps_mutex);
  return o;
}

/* Give back what this heap holds but does not use: empty pages (even the last of a class when forced). */
void mld_heap_collect(heap_t *h, bool force) {
  if (h == &mld_heap_empty) return;
#ifndef MALLARD_SECURE
  if (h == mld_tls_heap) bcache_flush_all(h);
#endif
  mld_outbox_flush(h);
  mld_spin_lock(&h->lock);
  visit_pages(h, collect_page, force);
  cache_flush(h);
  mld_spin_unlock(&h->lock);
}

/* ---- the slow path ---- */
#define SWEEP_LIMIT 8    /* full pages checked for remote frees per refill: bounds the slow path */

/* Slots of a new page of class c: the class's page size (slab_sizes), except for the heap's first page of the class
 * (none of it on its lists), which gets the fewest slots that hold a block (in the secure variant, besides the guard
 * page any page may end in). A class used once or twice — mstress's rare 40-256 KiB blocks — then pins a page of
 * its block's size, not several blocks' worth, which a span reused from dirty memory keeps resident whole; a class
 * in steady use gets full-size pages from its second page on. */
static unsigned new_page_slots(const heap_t *h, unsigned c) {
  unsigned slots = mld_opt.page_slots[c];
  if (slots == 1 || h->avail[c].head || h->full[c].head) return slots;
#ifdef MALLARD_SECURE
  size_t need = (size_t)mld_class_size[c] + mld_os_page();
#else
  size_t need = mld_class_size[c];
#endif
  size_t first = (need + MLD_SLOT_SIZE - 1) >> MLD_SLOT_SHIFT;
  return first < slots ? (unsigned)first : slots;
}

/* Claim: before a heap takes a span for a new page of class c, another heap's page of that class whose every
 * handed-out block has come back as a published remote free becomes its own: parked, or on the class list and not
 * current (an orphan's current pages too: below). Such a page is free memory that only its owner could reuse, and only
 * once its own class ran dry: an owner blocked or busy elsewhere (xmalloc's producer waiting on a full queue, an
 * orphan waiting for a thread to take it over) keeps it while the threads that freed into it fill new pages
 * (rptest/t4: twice the peak RSS). Safe with the owner running on, as the sweep's sweep_unparked and sweep_parked are
 * (under its lock): the count read before `used` (acquire) equal to it proves that the owner holds no block of the
 * page (blocks still in an outbox are counted in `used`, not published), and a page that is not current is reached
 * only through a block. h's lock is held: the registry and the other heaps' locks are only tried, so no lock order is
 * needed. Heaps bound to an arena (arenas.create) neither give nor take. Bounded: only orphans and heaps that remote
 * frees went into since their last walk (reclaim_wanted, read first), at most CLAIM_HEAPS of them locked and
 * CLAIM_PAGES pages of each looked at, none at all while no sweep is asked for, and after tries that found nothing the
 * next 1, 3, then 7 new pages are taken without one (the suite's buffers and mixed took 1.1-1.8 times as long when
 * every new page tried: docs/PERFORMANCE.md, issue 39's sixteenth pass). */
#define CLAIM_HEAPS 8
#define CLAIM_VISITS 32
#define CLAIM_PAGES 16
#define CLAIM_BACKOFF_MAX 3
/* An orphan's current pages may be claimed too: no thread allocates from them until one takes the orphan over, which
 * it does under o's lock and only then attaches (take_orphan; `orphan` was read under mld_heaps_mutex, which the
 * taker needs to clear it). larson/t4's orphans held a current page of each of their ~22 classes, emptied by the
 * successors' frees. */
static page_t *claim_from(heap_t *o, unsigned c, bool orphan) {   /* o's lock held */
  page_list_t *lists[2] = { &o->full[c], &o->avail[c] };
  unsigned n = 0;
  for (int k = 0; k < 2; k++) {
    for (page_t *pg = lists[k]->head; pg && n < CLAIM_PAGES; pg = pg->next, n++) {
      if (pg == o->current[c] && !orphan) continue;   /* `current` changes only under o's lock */
      if (!all_out_waiting(pg, 0)) continue;
      MLD_RACE_WINDOW();   /* its owner runs on meanwhile: it holds no block of this page */
      list_remove(lists[k], pg);
      if (pg == o->current[c]) set_current(o, c);
      mld_page_collect_remote(pg);
      page_leave_shared(pg);
      return pg;
    }
  }
  return NULL;
}

static arena_t *take_from_idle(heap_t *o, unsigned c);

/* A claimed page for h, or NULL; *taken is set to an arena that pages taken from an idle owner went to, for
 * adoption (take_from_idle), when that is what the tries found. */
static page_t *claim_parked(heap_t *h, unsigned c, arena_t **taken) {
  if (h->bound || h == &mld_exit_heap) return NULL;
  if (h->claim_skip) {
    h->claim_skip--;
    return NULL;
  }
  /* No sweep asked for: no remote free went into a page that is not current since the last sweep, which leaves only
   * busy heaps' pages behind, and asks again while any of those waits (parked_pending). */
  if (!atomic_load_explicit(&mld_sweep_since, memory_order_relaxed)) return NULL;
  if (pthread_mutex_trylock(&mld_heaps_mutex) != 0) return NULL;
  page_t *got = NULL;
  unsigned visits = 0, heaps = 0;
  uint64_t now = mld_now_ms();
  for (heap_t *o = mld_heaps_all; o && !got && !*taken && heaps < CLAIM_HEAPS && visits < CLAIM_VISITS; o = o->next_all) {
    visits++;
    /* An orphan is always looked at: frees into its current pages flag nothing. */
    bool orphan = o->orphan_ms != 0;
    if (o == h || o->bound || !(orphan || atomic_load_explicit(&o->reclaim_wanted, memory_order_relaxed))) continue;
    heaps++;
    if (!mld_spin_trylock(&o->lock)) continue;
    got = claim_from(o, c, orphan);
    /* Nothing wholly free: a live owner that has not refilled for MLD_HAND_OVER_IDLE_MS gives up pages it still holds
     * blocks of (`live` and orphan_ms change under mld_heaps_mutex, held). */
    uint64_t last = atomic_load_explicit(&o->last_slow_ms, memory_order_relaxed);
    if (!got && o->live && !orphan && last <= now && now - last >= MLD_HAND_OVER_IDLE_MS) *taken = take_from_idle(o, c);
    mld_spin_unlock(&o->lock);
  }
  pthread_mutex_unlock(&mld_heaps_mutex);
  if (*taken) {
    h->claim_misses = 0;
    return NULL;
  }
  if (!got) {
    if (h->claim_misses < CLAIM_BACKOFF_MAX) h->claim_misses++;
    h->claim_skip = (1u << h->claim_misses) - 1;
    return NULL;
  }
  h->claim_misses = 0;
  mld_page_init(got, c, h);   /* in_full 0, `heap` h (release) */
  h->stats.cls[c].npages++;
  h->stats.pages_claimed++;
  return got;
}

/* An abandoned page of class c from arena a with a free block, on h's class list; NULL when a has none. One may be
 * full (all its blocks still live): it joins our full list. */
static page_t *adopt_page(heap_t *h, arena_t *a, unsigned c) {
  page_t *pg;
  while ((pg = mld_arena_adopt(a, c, h)) != NULL) {
    h->stats.cls[c].npages++;   /* released by the heap that abandoned or handed it over (count_released) */
    mld_page_collect(pg);
    if (pg->used == 0) mld_page_init(pg, c, h);   /* every block came back: start it afresh */
    if (mld_page_refill(pg)) {
      /* A page handed over comes parked (sweep_parked, take_from_idle): unparked only now that `heap` names us, with
       * release, so that its last owner, reading in_full 0 (acquire) and then `heap`, sees it is no longer its own. */
      if (pg->in_full) __atomic_store_n(&pg->in_full, 0, __ATOMIC_RELEASE);
      list_push_head(&h->avail[c], pg);
      return pg;
    }
    park(h, c, pg);
  }
  return NULL;
}

static page_t *heap_new_page(heap_t *h, unsigned c) {
  arena_t *a = mld_heap_arena(h);
  page_t *pg;
  /* Abandoned pages first. The exit heap adopts none: its pages are only collected by sweeps, abandoned ones are
   * reaped as soon as they empty. */
  if (h != &mld_exit_heap && (pg = adopt_page(h, a, c)) != NULL) return pg;
  unsigned slots = new_page_slots(h, c);
  arena_t *taken = NULL;   /* where pages taken from an idle owner went (claim_parked) */
  if ((pg = cache_take(h, slots)) != NULL) {
    mld_page_init(pg, c, h);
    h->stats.cls[c].npages++;
    h->stats.cls[c].npages_cached++;
  } else if ((pg = claim_parked(h, c, &taken)) == NULL) {
    if (taken && (pg = adopt_page(h, taken, c)) != NULL) return pg;
    bool zero;
    pg = mld_arena_alloc_span_kind(a, slots, PAGE_SMALL, &zero);
    if (!pg) return NULL;
    mld_page_init(pg, c, h);
    h->stats.cls[c].npages++;
  }
  if (!pg->free) mld_page_extend(pg);
  list_push_head(&h->avail[c], pg);
  return pg;
}

static page_t *heap_find_page(heap_t *h, unsigned c) {
  page_list_t *avail = &h->avail[c], *full = &h->full[c];
  page_t *pg = avail->head, *first_moved = NULL;
  /* A page found with nothing free goes to the list's tail the first time (dry_seen) and is parked only when a later
   * refill finds it so again: a page its owner frees into while another is current (larson: two pages of a class
   * taking turns) gets those blocks back on the unlocked fast path, with no park, no locked free and no unpark per
   * turn. The walk stops at the first page it moved (each page looked at once); no other limit: a page is moved at
   * most once and parked at most once per return to the list, so the walk is amortised. */
  while (pg && pg != first_moved) {
    page_t *next = pg->next;
    if (mld_page_refill(pg)) {
      pg->dry_seen = 0;
      if (pg != avail->head) { list_remove(avail, pg); list_push_head(avail, pg); }
      return pg;
    }
    list_remove(avail, pg);
    if (!pg->dry_seen) {
      pg->dry_seen = 1;
      list_push_tail(avail, pg);
      if (!first_moved) first_moved = pg;
    } else {
      park(h, c, pg);                       /* nothing free twice: parked until frees arrive */
    }
    pg = next;
  }
  /* Sweep the oldest full pages for remote frees before taking a new page: the first found with a free block (remote
   * frees waiting, or collected by a sweep that left it parked) goes back to the class list; those before it, found
   * with none, move to the list's tail in their order (one splice: each is only read, its links left alone), so that
   * the next refill looks at others first. */
  page_t *last = NULL;
  pg = full->head;
  for (int i = 0; pg && i < SWEEP_LIMIT; i++) {
    if ((pg->free || mld_page_remote_waiting(pg)) && mld_page_collect(pg)) {
      if (last) list_rotate_through(full, last);
      list_remove(full, pg);
      set_in_full(pg, 0);
      list_push_head(avail, pg);
      return pg;
    }
    last = pg;
    pg = pg->next;
  }
  if (last) list_rotate_through(full, last);
  return heap_new_page(h, c);
}

/* Find a page with a free block for class c, make it current and take a block (NULL: no memory). */
static block_t *heap_refill_pop(heap_t *h, unsigned c) {
  page_t *pg = heap_find_page(h, c);
  if (unlikely(!pg)) { set_current(h, c); return NULL; }
  make_current(h, c, pg);
  block_t *b = pg->free;
  pg->free = blk_next(pg, b);
  pg->used++;
#ifdef MALLARD_SECURE
  secure_on_alloc(pg, b);
#endif
  return b;
}

void *mld_malloc_slow(heap_t *h, unsigned c) {
  if (unlikely(h == &mld_heap_empty)) {
    if (unlikely(mld_tls_exiting)) return mld_exit_alloc(c);
    h = mld_heap_get();
    if (!h) { errno = ENOMEM; return NULL; }
  }
  /* A refill is a good moment to send the batches (none waits past it), and before it: a page whose last frees
   * wait in this outbox can be claimed (claim_parked) only once they are published. */
  if (h->outbox_ops) mld_outbox_flush(h);
  mld_spin_lock(&h->lock);
  uint64_t now = mld_now_ms();
  atomic_store_explicit(&h->last_slow_ms, now, memory_order_relaxed);
  /* Other threads freed into pages this heap does not allocate from: a refill stops at the first page with a free
   * block, so pages further on would hold their remote frees (and stay, though emptied) until the class runs dry. */
  if (unlikely(atomic_load_explicit(&h->reclaim_wanted, memory_order_relaxed)) && now >= h->reclaim_ms + MLD_RECLAIM_MS) {
    atomic_store_explicit(&h->reclaim_wanted, 0, memory_order_relaxed);
    /* A walk reads a line of every page (a miss each, ~0.1-0.2 us): the next one waits a further 1 ms per 64 pages
     * walked, so that a heap of thousands of pages under a stream of remote frees spends ~1% of its time on it. */
    h->reclaim_ms = now + visit_pages(h, collect_page, false) / 64;
  }
  block_t *b = heap_refill_pop(h, c);
  mld_spin_unlock(&h->lock);
  if (unlikely(!b)) { errno = ENOMEM; return NULL; }
  h->stats.nmalloc[c]++;
  h->stats.cls[c].nrefills++;
  return b;
}

/* ---- the exit heap: allocations of threads past their heap's TLS destructor ----
 * Such a thread (a TLS destructor of the program that allocates, in any round) must not make a heap that no
 * destructor would abandon. It allocates from one shared heap under a lock; its frees, like every free of the
 * exit heap's blocks, take the remote path (no thread has the exit heap as its own). */
/* bound: it never moves between arenas (it is no thread's, and counts in no arena's nthreads). Its lock is
 * held for every operation on it: nobody has a lock-free path into it. */
heap_t mld_exit_heap = { .current = { [0 ... MLD_NUM_CLASSES - 1] = &mld_page_empty }, .bound = true };

void *mld_exit_alloc(unsigned c) {
  mld_ensure_init();
  mld_spin_lock(&mld_exit_heap.lock);
  if (!mld_exit_heap.arena) mld_exit_heap.arena = mld_arena_get(0);
  block_t *b = mld_exit_heap.arena ? heap_refill_pop(&mld_exit_heap, c) : NULL;
  if (b) __atomic_fetch_add(&mld_orphan_stats.nmalloc[c], 1, __ATOMIC_RELAXED);   /* the report sums these */
  mld_spin_unlock(&mld_exit_heap.lock);
  if (!b) errno = ENOMEM;
  return b;
}

void mld_exit_heap_lock(void) { mld_spin_lock(&mld_exit_heap.lock); }
void mld_exit_heap_unlock(void) { mld_spin_unlock(&mld_exit_heap.lock); }
void mld_exit_heap_fork_child(void) { atomic_store(&mld_exit_heap.lock, 0); }

/* May the class's only page stay with the heap although empty? One-slot pages always. A multi-slot page only once
 * its class has emptied MLD_KEEP_EMPTIES pages within MLD_KEEP_WINDOW_MS (a malloc/free loop over a medium size: it
 * then stays on the fast path; the secure variant keeps it at once, as its small pages are multi-slot at 64 KiB OS
 * pages and a double free or a write after free into a page just emptied is caught only while it stays), and while
 * the heap keeps at most MLD_KEEP_SLOTS slots of such pages (a loop over medium sizes must not thrash, an idle
 * thread must not sit on megabytes). A class used now and then gives its empty page back (to the page cache or the
 * arena) each time: mstress's rare 40-256 KiB blocks left empty current pages of up to 1 MiB a heap
 * (docs/PERFORMANCE.md, issue 39's twenty-fifth pass); a loop pays the slow path 8 times, once. A kept page is not
 * asked again until it is reused from scratch. */
static bool keep_empty(heap_t *h, page_t *pg) {
  if (pg->slot_count == 1 || !pg->keep_check) return true;
  unsigned cls = pg->size_class;
#ifndef MALLARD_SECURE
  uint32_t now = (uint32_t)mld_now_ms();   /* truncated: only differences are used, modulo 2^32 */
  if (now - h->empties_since[cls] > MLD_KEEP_WINDOW_MS) {
    h->empties_since[cls] = now;
    h->empties[cls] = 0;
  }
  if (++h->empties[cls] < MLD_KEEP_EMPTIES) return false;
  h->empties[cls] = MLD_KEEP_EMPTIES;   /* no wrap while the window lasts */
#endif
  size_t kept = 0;
  for (unsigned c = 0; c < MLD_NUM_CLASSES; c++) {
    const page_t *q = h->current[c];
    if (q != pg && q->slot_count > 1 && q->used == 0 && !q->keep_check) kept += q->slot_count;
  }
  if (kept + pg->slot_count > MLD_KEEP_SLOTS) return false;
  pg->keep_check = 0;
  pg->keep_on_empty = h->current[cls] == pg;
  return true;
}

/* The owner freed a block of a parked (full) page, or the last block of a page. A parked page returns to the
 * class list; an empty page goes to the page cache or back to the arena, unless it is the only page of a
 * one-slot class (kept: a malloc/free loop must not thrash). Empty multi-slot pages always leave, so that
 * at most a 64 KiB page per small class stays with an idle thread. Under the heap lock: a sweep walks the class
 * lists too (sweep_unparked), and the class lists and `current` change only under it. */
void mld_page_retire(heap_t *h, page_t *pg) {
  unsigned c = pg->size_class;
  if (pg->in_full) {
    list_remove(&h->full[c], pg);
    set_in_full(pg, 0);
    list_push_tail(&h->avail[c], pg);
    if (pg->used) { set_current(h, c); return; }
  }
  if (h->avail[c].head == pg && !pg->next && keep_empty(h, pg)) return;
  list_remove(&h->avail[c], pg);
  set_current(h, c);
  page_release_or_cache(h, pg);
}

/* The owner's free fast path emptied a page that may not stay (api.c): retired under the heap lock. */
void mld_page_retire_owner(heap_t *h, page_t *pg) {
  mld_spin_lock(&h->lock);
  mld_page_retire(h, pg);
  mld_spin_unlock(&h->lock);
}

/* The owner frees a block of one of its parked pages: under the heap lock, since a sweep may be giving the
 * page's remote frees back meanwhile (the fast path never writes a parked page). */
void mld_free_parked(void *p) {
  heap_t *h = mld_tls_heap;
  page_t *pg = page_of(segment_of(p), p);
  block_t *b = p;
  MLD_RACE_WINDOW();   /* in_full was read unlocked: a sweep may be collecting or handing over this page meanwhile */
  mld_spin_lock(&h->lock);
  /* A sweep hands a parked page over under this lock (sweep_parked): read again under it, `heap` is the truth. */
  if (unlikely(atomic_load_explicit(&pg->heap, memory_order_relaxed) != h)) {
    mld_spin_unlock(&h->lock);
    mld_free_remote(pg, p);
    return;
  }
  mld_owner_push(pg, b);
  pg->used--;
  h->stats.frees_parked++;
  /* Unparked meanwhile by the owner? Not while it is here. By a take from outside that parked it and gave it back,
   * the owner's hazard naming it (take_from_idle): then the fast path's rule, under the lock. */
  if (pg->in_full || (pg->used == 0 && !pg->keep_on_empty)) mld_page_retire(h, pg);
  mld_spin_unlock(&h->lock);
}

#ifndef MALLARD_SECURE
/* A thread about to send the batch of n blocks that would bring back the last handed-out blocks of pg, a parked page of
 * o: the page, with every block of it free, goes back to its arena at once, the batch with it (never published). An
 * owner blocked or busy elsewhere would otherwise keep it until its next walk of its pages (MLD_RECLAIM_MS), a sweep or
 * a claim, while its class's other pages fill (xmalloc-test: producers blocked on a full queue held a third of the
 * peak RSS in pages their consumers had emptied; docs/PERFORMANCE.md, issue 39). Under o's lock (tried only: false,
 * and the batch is sent as usual, when it is held or anything below has changed): `heap` naming o, the page is o's
 * and stays so, and parked (in_full is written under the lock), so o's fast paths do not touch it; claim_from's proof
 * then holds with the batch counted (all_out_waiting): the published count read before `used` (acquire) plus n equal
 * to it proves that every block handed out is published or in the batch, so o holds none and no other thread can free
 * into it. The page cannot have been released before the lock: the batch's blocks keep it in use. To the arena, not to
 * o's page cache: any thread may take it from there, and it decays (in o's cache a blocked o would keep it, and the
 * thread that emptied it could not reuse it: test_claim `outbox`). Heaps bound to an arena (arenas.create) keep their
 * pages, as claims leave them. */
bool mld_heap_give_emptied(heap_t *o, page_t *pg, uint32_t n) {
  if (o->bound || !mld_spin_trylock(&o->lock)) return false;
  arena_t *a;
  /* The arena's lock is only tried too: a sender that waited for it, beside the producers taking spans from it, slept
   * in futex waits (xmalloc-test: twice the samples in the scheduler). A parked page is never current once the lock
   * that parked it is released; checked all the same, as claim_from does: the fast path allocates from `current`. */
  if (atomic_load_explicit(&pg->heap, memory_order_relaxed) != o || !pg->in_full || pg == o->current[pg->size_class] ||
      !all_out_waiting(pg, n) ||
      !mld_arena_trylock(a = segment_of(pg)->arena)) {
    mld_spin_unlock(&o->lock);
    return false;
  }
  list_remove(&o->full[pg->size_class], pg);
  mld_page_collect_remote(pg);   /* thread_free emptied; the batch's blocks are dropped with the page */
  page_leave_shared(pg);
  mld_spin_unlock(&o->lock);
  MLD_RACE_WINDOW();   /* out of o's lists, `heap` NULL: the page is this thread's alone until its span is freed */
  __atomic_fetch_add(&mld_orphan_stats.pages_emptied, 1, __ATOMIC_RELAXED);
  mld_arena_free_span_unlock(a, pg);
  return true;
}
#endif

/* free() of a block of a small page that is not the calling thread's (a remote free). */
void mld_free_remote(page_t *pg, void *p) {
  heap_t *h = mld_tls_heap;
  block_t *b = p;
  /* A thread that only frees gets a heap too: its counters and its outbox are its own (a shared counter
   * written by every such thread serialised them). Not past its destructor: nothing would abandon it. */
  if (unlikely(h == &mld_heap_empty) && !mld_tls_exiting) {
    heap_t *own = mld_heap_get_near(atomic_load_explicit(&pg->heap, memory_order_relaxed));
    if (own) h = own;   /* may own pg now: the block still goes as a remote free, which its owner collects */
  }
  /* Counted first: once the block is published, the page may be collected, released and reused by others. */
  MLD_STAT_ADD(h, cls[pg->size_class].nfree, 1);
  MLD_STAT_ADD(h, remote_frees, 1);
#ifdef MALLARD_SECURE
  mld_remote_free_secure(h, pg, b);   /* its remote bit, set now; the word published in a batch (outbox.c) */
#else
  if (likely(h != &mld_heap_empty)) {
    mld_outbox_add(h, pg, b);   /* batched: one CAS per batch, sent later (outbox.c) */
    return;
  }
  mld_remote_push(pg, b, b, 1);   /* a thread past its destructor: at once */
#endif
}

/* ---- sweeps: memory that waits on no thread's next allocation ----
 * Three kinds of pages are given back by a sweep rather than by their owner: the parked pages of a heap whose
 * owner has not refilled for the sweep age (blocks freed by other threads into them would otherwise wait
 * until it allocates again), every empty page of the exit heap (nobody allocates from it but under its lock),
 * and the pages of a heap whose thread ended without its destructor (its `life` mutex, robust, reads as
 * EOWNERDEAD). A send into a parked or exit-heap page asks for a sweep (mld_sweep_want); the purging thread
 * runs it once the sweep age has passed (mld_sweep_age: 16 ms, at most the decay age), malloc_trim and mallard_collect
 * at once. A busy owner is left to itself: a send into a page it does not allocate from also asks it to walk its pages
 * at a refill (reclaim_wanted, mld_malloc_slow). */

/* Hand over a parked page of an idle live owner that other threads have freed a good share of (MLD_HAND_OVER_SHARE
 * of its blocks free), while the owner still holds some: it is abandoned to its arena, still parked, for the next
 * heap that needs a page of its class (heap_new_page adopts before it takes a span). larson's main thread allocates
 * the blocks its workers replace, then waits in pthread_join: its pages, freed into by the workers, would otherwise
 * stay its own until their last block came back, while the workers filled new pages (docs/PERFORMANCE.md, issue 39).
 * Not an orphan's pages: the thread that takes the orphan over frees the blocks handed on to it as their owner.
 * Safe with the owner running on: its free reads in_full (acquire) before `heap` (api.c dealloc); in_full stays 1
 * until an adopter, named by `heap` first, clears it with release; and its locked path into a parked page reads
 * `heap` again under this lock (mld_free_parked). Once handed over, its frees into the page are remote frees. */
#define MLD_HAND_OVER_SHARE 8   /* at least 1/8 of the page's blocks free */
static bool hand_over_ok(const heap_t *h, const page_t *pg) {
  if (!h->live || h->orphan_ms || h == &mld_exit_heap) return false;
  size_t free_blocks = (size_t)pg->reserved - pg->used;   /* collected or never carved */
  return free_blocks * MLD_HAND_OVER_SHARE >= pg->reserved;
}
static void hand_over(heap_t *h, unsigned c, page_t *pg) {
  list_remove(&h->full[c], pg);
  MLD_RACE_WINDOW();   /* out of its lists, still named by `heap`: the owner may be freeing into it meanwhile */
  __atomic_fetch_add(&mld_orphan_stats.pages_handed_over, 1, __ATOMIC_RELAXED);   /* the owner writes its own counters unlocked */
  abandon_to_arena(pg);   /* in_full stays 1 */
}

/* Take from an idle live owner: pages of class c on o's class list (not current) that other threads have freed a
 * good share of (MLD_HAND_OVER_SHARE, counting remote frees not yet collected) while o still holds blocks of them,
 * for a thread that needs a page of the class. larson's main thread allocates the blocks its workers replace and then
 * waits: its pages, still holding blocks, sat on its class lists (never parked: it frees no more) while the workers
 * filled new ones, twice the memory at the start (docs/PERFORMANCE.md, issue 39). The owner may be freeing into such
 * a page without a lock (api.c dealloc: owner_slow read 0, then the push): so each is parked first (in_full 1, under
 * o's lock), then a barrier runs on every thread (mld_os_barrier_all), then o's hazard is read. A free that reads
 * owner_slow after the barrier sees in_full and takes the locked path (mld_free_parked), which reads `heap` under
 * this lock; a free that read it before stored its block as the hazard before that read, so the barrier makes the
 * store visible: the page it names goes back to the class list as it was, and every other page has no such free in
 * flight, and its last free's writes are visible (the hazard is stored with release). Those are handed over, parked,
 * as sweep_parked does (the same proof from then on); the caller adopts them from the arena returned (NULL: none).
 * Without the barrier (an emulator, a seccomp filter) nothing is taken. o's lock held, and mld_heaps_mutex. */
#define TAKE_PAGES 16    /* pages parked per barrier */
static arena_t *take_from_idle(heap_t *o, unsigned c) {
  page_t *cand[TAKE_PAGES];
  unsigned n = 0, looked = 0;
  for (page_t *pg = o->avail[c].head, *next; pg && n < TAKE_PAGES && looked < CLAIM_PAGES * 4; pg = next, looked++) {
    next = pg->next;
    if (pg == o->current[c]) continue;   /* the owner's malloc pops from it unlocked */
    size_t used = __atomic_load_n(&pg->used, __ATOMIC_RELAXED), published = mld_page_remote_published(pg);
    size_t free_blocks = (size_t)pg->reserved - used + (published < used ? published : used);
    if (free_blocks * MLD_HAND_OVER_SHARE < pg->reserved || used == 0) continue;
    list_remove(&o->avail[c], pg);
    set_in_full(pg, 1);
    cand[n++] = pg;
  }
  if (!n) return NULL;
  bool fenced = mld_os_barrier_all();
  MLD_RACE_WINDOW();   /* parked, not yet given: the owner's frees into these pages wait for o's lock meanwhile */
  const uint8_t *hz = atomic_load_explicit(&o->hazard, memory_order_acquire);
  arena_t *to = NULL;
  for (unsigned i = 0; i < n; i++) {
    page_t *pg = cand[i];
    const uint8_t *start = page_start(pg);
    if (!fenced || (hz >= start && hz < start + ((size_t)pg->slot_count << MLD_SLOT_SHIFT))) {
      set_in_full(pg, 0);   /* back as it was: the owner's free may be pushing into it */
      list_push_tail(&o->avail[c], pg);
      continue;
    }
    /* The owner's last free into it is done (above): its `used`, written last with release, read with acquire, so
     * that what it wrote is seen by the adopter too (ThreadSanitizer sees no barrier). */
    (void)__atomic_load_n(&pg->used, __ATOMIC_ACQUIRE);
    MLD_RACE_WINDOW();   /* parked from outside, still named by `heap`: the owner's frees into it wait for o's lock */
    __atomic_fetch_add(&mld_orphan_stats.pages_taken_idle, 1, __ATOMIC_RELAXED);
    to = abandon_to_arena(pg);   /* in_full stays 1 */
  }
  return to;
}

/* Parked pages whose blocks have all come back go back to their arena (heap lock held, by a thread that is
 * not the owner). The owner's fast paths never touch a parked page: they allocate from `current` pages only,
 * and divert frees into parked pages to mld_free_parked, which waits for this lock. So `used` and `free` of a
 * parked page change only under the lock, and a page whose every handed-out block is back is unreachable to
 * its owner. Returns the bytes given back to the arena. */
static size_t sweep_parked(heap_t *h) {
  size_t bytes = 0;
  for (unsigned c = 0; c < MLD_NUM_CLASSES; c++) {
    for (page_t *pg = h->full[c].head, *next; pg; pg = next) {
      next = pg->next;
      bool collected = mld_page_collect_remote(pg);
      if (pg->used && hand_over_ok(h, pg)) {
        hand_over(h, c, pg);
        continue;
      }
      if (!collected || pg->used) continue;
      MLD_RACE_WINDOW();   /* the owner runs on meanwhile: it must not reach this page */
      list_remove(&h->full[c], pg);
      set_in_full(pg, 0);
      bytes += (size_t)pg->slot_count << MLD_SLOT_SHIFT;
      page_leave_shared(pg);
      mld_arena_free_span(segment_of(pg)->arena, pg);
    }
  }
  return bytes;
}

/* Pages of the class lists that other threads have emptied are parked, so that sweep_parked gives them back (heap
 * lock held, by a thread that may not be the owner). Such a page is not `current` (the malloc fast path pops from
 * current pages only; `current` changes only under the lock), so the owner's fast paths reach it only by freeing a
 * block of it that it still holds. Every block of it that is handed out waits as a published remote free exactly
 * when the count of those equals `used`: that count only grows while the lock is held (only holders of the lock
 * collect), and `used` only falls (the owner's frees), so a count read before `used` that equals it proves the
 * owner holds none. Read with acquire: `used` is the last thing an owner's free writes (a release store, api.c), so
 * whatever that free wrote into the page is done. From then on the owner cannot reach the page (a double free
 * aside); parking it sends any later owner free to the locked path all the same. Pages whose blocks still wait in
 * an outbox (the secure variant: in an owed word) are counted in `used` and not published: they stay. */
static void sweep_unparked(heap_t *h) {
  for (unsigned c = 0; c < MLD_NUM_CLASSES; c++) {
    for (page_t *pg = h->avail[c].head, *next; pg; pg = next) {
      next = pg->next;
      if (pg == h->current[c] || !all_out_waiting(pg, 0)) continue;
      MLD_RACE_WINDOW();   /* the owner runs on meanwhile: it holds no block of this page */
      list_remove(&h->avail[c], pg);
      set_in_full(pg, 1);
      list_push_tail(&h->full[c], pg);
    }
  }
}

/* Has a parked page, or a page of the class lists other than a current one, received remote frees (heap lock
 * held)? */
static bool parked_pending(heap_t *h) {
  for (unsigned c = 0; c < MLD_NUM_CLASSES; c++) {
    for (page_t *pg = h->full[c].head; pg; pg = pg->next)
      if (mld_page_remote_waiting(pg)) return true;
    for (page_t *pg = h->avail[c].head; pg; pg = pg->next)
      if (pg != h->current[c] && mld_page_remote_waiting(pg)) return true;
  }
  return false;
}

/* A heap whose thread ended without abandoning it, or NULL. Its `life` is then ours (made consistent). */
static heap_t *find_dead_heap(void) {
  pthread_mutex_lock(&mld_heaps_mutex);
  heap_t *dead = NULL;
  for (heap_t *h = mld_heaps_all; h && !dead; h = h->next_all) {
    if (h->orphan_ms) continue;   /* no thread holds an orphan's `life` */
    int rc = pthread_mutex_trylock(&h->life);
    if (rc == EOWNERDEAD) {
      pthread_mutex_consistent(&h->life);
      dead = h;
    } else if (rc == 0) {
      pthread_mutex_unlock(&h->life);   /* not expected (registered heaps hold it): leave it as it was */
    }
  }
  pthread_mutex_unlock(&mld_heaps_mutex);
  return dead;
}

/* Sweep what is due (everything when forced); returns the bytes given back to the arenas. */
size_t mld_heaps_sweep(bool force) {
  size_t bytes = 0;
  for (heap_t *dead; (dead = find_dead_heap()) != NULL;) mld_heap_abandon(dead);
  uint64_t now = mld_now_ms();
  uint64_t req = atomic_exchange(&mld_sweep_since, 0);   /* sends after this ask again */
  mld_fence_after_rmw();   /* pairs with remote_notify's (outbox.c): it sees 0, or we its batch */
  /* A soon request (a send into a parked page of an idle owner) is due, and counts owners idle, after the hand-over
   * delay: their parked pages are handed over or given back then. */
  uint64_t age = mld_sweep_request_age(req), since = req >> 1;
  if (!force && (!req || now < since + age)) {
    if (req) mld_sweep_keep(req);   /* not due yet: keep the request */
    return 0;
  }
  bool young = false;   /* orphans too young to abandon remain */
  /* Orphans wait the decay age, not the sweep age: a pool's next thread may take one over until then. */
  for (heap_t *o; (o = take_stale_orphan(now, mld_base_age(), force, &young)) != NULL;) mld_heap_abandon(o);
  mld_spin_lock(&mld_exit_heap.lock);
  if (mld_exit_heap.arena) {
    visit_pages(&mld_exit_heap, collect_page, true);
    cache_flush(&mld_exit_heap);
  }
  mld_spin_unlock(&mld_exit_heap.lock);
  bool busy = false;
  pthread_mutex_lock(&mld_heaps_mutex);
  for (heap_t *h = mld_heaps_all; h; h = h->next_all) {
    if (!mld_spin_trylock(&h->lock)) { busy = true; continue; }
    /* An owner that refilled within the sweep age reclaims its pages itself (reclaim_wanted, mld_malloc_slow). */
    uint64_t last = atomic_load_explicit(&h->last_slow_ms, memory_order_relaxed);
    if (force || (last <= now && now - last >= age)) {
      sweep_unparked(h);
      bytes += sweep_parked(h);
    }
    else busy |= parked_pending(h);
    mld_spin_unlock(&h->lock);
  }
  pthread_mutex_unlock(&mld_heaps_mutex);
  if (busy || young) mld_sweep_want();   /* look again one delay later: a busy owner may have gone idle by then */
  return bytes;
}

/* ---- fork ---- */
/* The exit heap's lock is taken before the heaps' (it is held while a page is found, which may take them). */
void mld_heaps_lock(void) { mld_exit_heap_lock(); pthread_mutex_lock(&mld_heaps_mutex); }
void mld_heaps_unlock(void) { pthread_mutex_unlock(&mld_heaps_mutex); mld_exit_heap_unlock(); }

/* In the child only the forking thread lives. The other threads' heaps may have been mid-update (their owners
 * change them without locks, and hold their heap lock in slow paths), so their pages, lists and outboxes are left
 * alone: their pages stay allocated in the child, as in jemalloc and mimalloc, and their pending batches are not
 * sent (a half-written outbox entry cannot be told from a whole one). They leave the registry: a sweep would find
 * the lock of a heap caught in a slow path held for ever and ask for another sweep every decay period, and
 * nothing of theirs can come back anyway. Their counters are folded into the dead threads' record, so the
 * statistics keep them. */
void mld_heaps_fork_child(void) {
  pthread_mutex_init(&mld_heaps_mutex, NULL);
  mld_exit_heap_fork_child();
  orphans = NULL;   /* made again from the registry: a heap being taken or abandoned at the fork was out of it */
  for (heap_t *o = mld_heaps_all, *next; o; o = next) {
    next = o->next_all;
    if (o == mld_tls_heap) continue;
    if (o->orphan_ms) {   /* an orphan is whole (changed only by its taker, out of the list): back on the list */
      life_init(o);       /* unlocked: a thread of the parent may have held it, taking the orphan */
      o->next_free = orphans;
      orphans = o;
      continue;
    }
    mld_stats_add(&mld_dead_stats, &o->stats);
    o->arena->nthreads--;
    o->live = false;
    if (o->prev_all) o->prev_all->next_all = o->next_all; else mld_heaps_all = o->next_all;
    if (o->next_all) o->next_all->prev_all = o->prev_all;
    o->next_all = o->prev_all = NULL;   /* never reused: its pages are still its */
  }
  /* The forking thread lives on with another thread id: its heap's robust `life` is made anew and held again
   * (the parent's copy names the parent's thread, which a child thread could never unlock). */
  heap_t *h = mld_tls_heap;
  if (h != &mld_heap_empty) {
    life_begin(h);
    atomic_store_explicit(&h->lock, 0, memory_order_relaxed);
  }
}
