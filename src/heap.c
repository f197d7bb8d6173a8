/* heap.c — thread-local heaps: the malloc slow path, page lists per size class, remote frees, thread exit and adoption. */
#define _GNU_SOURCE
#include "internal.h"
#include "secure.h"
#include <errno.h>
#include <string.h>

/* Every thread starts on this shared empty heap; its first malloc creates a real one. */
heap_t mld_heap_empty = { .current = { [0 ... MLD_NUM_CLASSES - 1] = &mld_page_empty } };
__thread heap_t *mld_tls_heap __attribute__((tls_model("initial-exec"))) = &mld_heap_empty;

pthread_mutex_t mld_heaps_mutex = PTHREAD_MUTEX_INITIALIZER;
heap_t *mld_heaps_all;                  /* live heaps (statistics, fork) */
static heap_t *heaps_pool;              /* heap structs of exited threads, reused */
heap_stats_t mld_dead_stats;            /* counters of exited threads, folded in when they exit */
heap_stats_t mld_orphan_stats;          /* counters of frees by threads that never allocated */
__thread bool mld_tls_contended __attribute__((tls_model("initial-exec")));   /* set when this thread waited for an arena lock */
_Atomic(unsigned) mld_arena_cap;          /* mallopt(M_ARENA_MAX): threads spread over at most this many (0: all) */
__thread bool mld_tls_exiting __attribute__((tls_model("initial-exec")));     /* set by the heap's TLS destructor */
extern pthread_key_t mld_heap_key;

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

static void set_current(heap_t *h, unsigned c) {
  h->current[c] = h->avail[c].head ? h->avail[c].head : &mld_page_empty;
}

/* ---- heap life ---- */
/* dst += src, counter by counter; src may be updated meanwhile by its owner (relaxed loads: a snapshot). */
void mld_stats_add(heap_stats_t *dst, const heap_stats_t *src) {
  const uint64_t *s = (const uint64_t *)src;
  uint64_t *d = (uint64_t *)dst;
  for (size_t i = 0; i < sizeof(heap_stats_t) / sizeof(uint64_t); i++) d[i] += __atomic_load_n(&s[i], __ATOMIC_RELAXED);
}

/* The calling thread's heap, made on first use; NULL when none can be made (no memory, or the thread is past its
 * heap's TLS destructor: a heap made now might never be abandoned, so such a thread uses the exit heap). */
heap_t *mld_heap_get(void) {
  heap_t *h = mld_tls_heap;
  if (h != &mld_heap_empty) return h;
  if (mld_tls_exiting) return NULL;
  mld_ensure_init();
  /* Arena 0 may be missing when memory ran out during initialisation: every heap needs it. */
  if (!mld_arena_get(0) && mld_arena_create() < 0) return NULL;
  pthread_mutex_lock(&mld_heaps_mutex);
  h = heaps_pool;
  if (h) heaps_pool = h->next_free;
  else h = mld_meta_alloc(sizeof(heap_t));
  if (!h) { pthread_mutex_unlock(&mld_heaps_mutex); return NULL; }
  memset(h, 0, sizeof *h);
  for (unsigned c = 0; c < MLD_NUM_CLASSES; c++) h->current[c] = &mld_page_empty;
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
  mld_tls_heap = h;                       /* before setspecific: it may allocate, and must find this heap */
  pthread_setspecific(mld_heap_key, h);
  return h;
}

/* The heap's arena for its next span. A thread whose last arena operation had to wait for the lock moves to
 * the next automatic arena: threads spread over the arenas as contention appears, and only then. */
arena_t *mld_heap_arena(heap_t *h) {
  if (unlikely(h == &mld_heap_empty)) return mld_arena_get(0);   /* a thread past its heap (exit heap, large blocks) */
  if (unlikely(mld_tls_contended)) {
    mld_tls_contended = false;
    unsigned n = atomic_load_explicit(&mld_narenas, memory_order_acquire);
    unsigned autos = mld_opt.narenas && mld_opt.narenas < n ? mld_opt.narenas : mld_auto_arenas;
    if (autos > n) autos = n;   /* some automatic arenas could not be made (no memory at initialisation) */
    unsigned cap = atomic_load_explicit(&mld_arena_cap, memory_order_relaxed);
    if (cap && autos > cap) autos = cap;
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
/* An empty page has no live block: its allocation bits must all be clear (a bookkeeping check). */
static void secure_check_empty(const page_t *pg) {
  uint8_t *start = page_start(pg);
  uint64_t bit;
  _Atomic(uint64_t) *w = bm_word(start, &bit);
  for (size_t i = 0; i < ((size_t)pg->slot_count << MLD_SLOT_SHIFT) / 1024; i++)
    if (atomic_load_explicit(&w[i], memory_order_relaxed)) mld_secure_fail("live block in a page being released:", start + i * 1024);
}
#endif

/* An empty page leaves the heap's lists: no block of it is live, nobody frees into it any more. */
static void page_leave(heap_t *h, page_t *pg) {
#ifdef MALLARD_SECURE
  secure_check_empty(pg);
#endif
  h->stats.cls[pg->size_class].npages_released++;
  atomic_store_explicit(&pg->heap, NULL, memory_order_relaxed);
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

/* Visit every page of a class (class list, then full list); the visitor may unlink or release the page. */
typedef void (*page_visit_t)(heap_t *h, unsigned c, page_list_t *list, page_t *pg, bool force);
static void visit_pages(heap_t *h, page_visit_t visit, bool force) {
  for (unsigned c = 0; c < MLD_NUM_CLASSES; c++) {
    page_list_t *lists[2] = { &h->avail[c], &h->full[c] };
    for (int k = 0; k < 2; k++) {
      for (page_t *pg = lists[k]->head, *next; pg; pg = next) {
        next = pg->next;
        visit(h, c, lists[k], pg, force);
      }
    }
    set_current(h, c);
  }
  cache_flush(h);
}

/* Thread exit: an empty page goes back to its arena, the others are abandoned for adoption. */
static void abandon_page(heap_t *h, unsigned c, page_list_t *list, page_t *pg, bool force) {
  (void)force;
  list_remove(list, pg);
  set_current(h, c);   /* never leave current[c] on a page that is being given away */
  pg->in_full = 0;
  mld_page_collect(pg);
  if (pg->used == 0) page_release(h, pg);
  else mld_arena_abandon(segment_of(pg)->arena, pg);
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
    pg->in_full = 0;
    list_push_tail(&h->avail[c], pg);
  }
}

/* A thread is exiting: its pages are released or abandoned, its counters kept, its struct recycled. */
void mld_heap_abandon(heap_t *h) {
  visit_pages(h, abandon_page, true);
  pthread_mutex_lock(&mld_heaps_mutex);
  mld_stats_add(&mld_dead_stats, &h->stats);
  h->arena->nthreads--;
  h->live = false;
  if (h->prev_all) h->prev_all->next_all = h->next_all; else mld_heaps_all = h->next_all;
  if (h->next_all) h->next_all->prev_all = h->prev_all;
  h->next_free = heaps_pool;
  heaps_pool = h;
  pthread_mutex_unlock(&mld_heaps_mutex);
}

/* Give back what this heap holds but does not use: empty pages (even the last of a class when forced). */
void mld_heap_collect(heap_t *h, bool force) {
  if (h == &mld_heap_empty) return;
  visit_pages(h, collect_page, force);
}

/* ---- the slow path ---- */
#define SWEEP_LIMIT 8    /* full pages checked for remote frees per refill: bounds the slow path */

static page_t *heap_new_page(heap_t *h, unsigned c) {
  arena_t *a = mld_heap_arena(h);
  page_t *pg;
  /* Abandoned pages first. One may be full (all its blocks still live): it joins our full list. */
  while ((pg = mld_arena_adopt(a, c, h)) != NULL) {
    mld_page_collect(pg);
    if (pg->used == 0) mld_page_init(pg, c, h);   /* every block came back: start it afresh */
    if (pg->free || mld_page_extend(pg)) {
      list_push_head(&h->avail[c], pg);
      return pg;
    }
    pg->in_full = 1;
    list_push_tail(&h->full[c], pg);
  }
  if ((pg = cache_take(h, mld_opt.page_slots[c])) != NULL) {
    mld_page_init(pg, c, h);
    h->stats.cls[c].npages++;
    h->stats.cls[c].npages_cached++;
  } else {
    bool zero;
    pg = mld_arena_alloc_span_kind(a, mld_opt.page_slots[c], PAGE_SMALL, &zero);
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
  page_t *pg = avail->head;
  /* No limit here: a page is parked at most once per return from the full list, so the walk is amortised. */
  while (pg) {
    page_t *next = pg->next;
    if (mld_page_collect(pg) || mld_page_extend(pg)) {
      if (pg != avail->head) { list_remove(avail, pg); list_push_head(avail, pg); }
      return pg;
    }
    list_remove(avail, pg);                 /* nothing free: park it until remote frees arrive */
    pg->in_full = 1;
    list_push_tail(full, pg);
    pg = next;
  }
  /* Sweep the oldest full pages for remote frees before taking a new page. */
  pg = full->head;
  for (int i = 0; pg && i < SWEEP_LIMIT; i++) {
    page_t *next = pg->next;
    list_remove(full, pg);
    if (mld_page_collect(pg)) {
      pg->in_full = 0;
      list_push_head(avail, pg);
      return pg;
    }
    list_push_tail(full, pg);
    pg = next;
  }
  return heap_new_page(h, c);
}

/* Find a page with a free block for class c, make it current and take a block (NULL: no memory). */
static block_t *heap_refill_pop(heap_t *h, unsigned c) {
  page_t *pg = heap_find_page(h, c);
  if (unlikely(!pg)) { set_current(h, c); return NULL; }
  h->current[c] = pg;
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
  block_t *b = heap_refill_pop(h, c);
  if (unlikely(!b)) { errno = ENOMEM; return NULL; }
  h->stats.cls[c].nmalloc++;
  h->stats.cls[c].nrefills++;
  mld_purge_thread_maybe_start();   /* no lock held, lists consistent: see purge.c */
  return b;
}

/* ---- the exit heap: allocations of threads past their heap's TLS destructor ----
 * Such a thread (a TLS destructor of the program that allocates, in any round) must not make a heap that no
 * destructor would abandon. It allocates from one shared heap under a lock; its frees, like every free of the
 * exit heap's blocks, take the remote path (no thread has the exit heap as its own). */
static pthread_mutex_t exit_lock = PTHREAD_MUTEX_INITIALIZER;
/* bound: it never moves between arenas (it is no thread's, and counts in no arena's nthreads). */
static heap_t exit_heap = { .current = { [0 ... MLD_NUM_CLASSES - 1] = &mld_page_empty }, .bound = true };

void *mld_exit_alloc(unsigned c) {
  mld_ensure_init();
  pthread_mutex_lock(&exit_lock);
  if (!exit_heap.arena) exit_heap.arena = mld_arena_get(0);
  block_t *b = exit_heap.arena ? heap_refill_pop(&exit_heap, c) : NULL;
  if (b) __atomic_fetch_add(&mld_orphan_stats.cls[c].nmalloc, 1, __ATOMIC_RELAXED);   /* the report sums these */
  pthread_mutex_unlock(&exit_lock);
  if (!b) errno = ENOMEM;
  return b;
}

void mld_exit_heap_lock(void) { pthread_mutex_lock(&exit_lock); }
void mld_exit_heap_unlock(void) { pthread_mutex_unlock(&exit_lock); }
void mld_exit_heap_fork_child(void) { pthread_mutex_init(&exit_lock, NULL); }

/* May the class's only page stay with the heap although empty? One-slot pages always; multi-slot pages while
 * the heap keeps at most MLD_KEEP_SLOTS slots of them (a loop over medium sizes must not thrash, an idle
 * thread must not sit on megabytes). A kept page is not asked again until it is reused from scratch. */
static bool keep_empty(heap_t *h, page_t *pg) {
  if (pg->slot_count == 1 || !pg->keep_check) return true;
  size_t kept = 0;
  for (unsigned c = 0; c < MLD_NUM_CLASSES; c++) {
    const page_t *q = h->current[c];
    if (q != pg && q->slot_count > 1 && q->used == 0 && !q->keep_check) kept += q->slot_count;
  }
  if (kept + pg->slot_count > MLD_KEEP_SLOTS) return false;
  pg->keep_check = 0;
  return true;
}

/* The owner freed a block of a parked (full) page, or the last block of a page. A parked page returns to the
 * class list; an empty page goes to the page cache or back to the arena, unless it is the only page of a
 * one-slot class (kept: a malloc/free loop must not thrash). Empty multi-slot pages always leave, so that
 * at most a 64 KiB page per small class stays with an idle thread. */
void mld_page_retire(heap_t *h, page_t *pg) {
  unsigned c = pg->size_class;
  if (pg->in_full) {
    list_remove(&h->full[c], pg);
    pg->in_full = 0;
    list_push_tail(&h->avail[c], pg);
    if (pg->used) { set_current(h, c); return; }
  }
  if (h->avail[c].head == pg && !pg->next && keep_empty(h, pg)) return;
  list_remove(&h->avail[c], pg);
  set_current(h, c);
  page_release_or_cache(h, pg);
}

/* free() of a block whose page is not the calling thread's: remote small frees, large, huge and invalid pointers. */
void mld_free_slow(segment_t *seg, page_t *pg, void *p) {
  heap_t *h = mld_tls_heap;
  if (unlikely(seg->kind == SEG_HUGE)) {
    mld_huge_free(h, seg, p);   /* checks that p is the live block of the mapping */
    return;
  }
  if (pg->kind == PAGE_SMALL) {
    block_t *b = p;
#ifdef MALLARD_SECURE
    secure_check_free(pg, b);   /* the owner clears the bitmap bit when it collects the block */
#endif
    /* Counted first: once the block is published, the page may be collected, released and reused by others. */
    MLD_STAT_ADD(h, cls[pg->size_class].nfree, 1);
    MLD_STAT_ADD(h, remote_frees, 1);
    /* A page of an exited thread: its arena is asked for a reap after the push (arenas live for ever; the page
     * itself is not touched again). Asked after, so that a reap already under way cannot miss this block. */
    arena_t *reap = unlikely(atomic_load_explicit(&pg->heap, memory_order_relaxed) == NULL) ? segment_of(pg)->arena : NULL;
    /* Remote free: one lock-free push; the owner (or whoever adopts the page) collects it. */
    block_t *old = atomic_load_explicit(&pg->thread_free, memory_order_relaxed);
    do {
#ifdef MALLARD_SECURE
      if (unlikely(old == b)) mld_secure_fail("double free (by another thread) of", b);
#endif
      blk_set_next(pg, b, old);
    } while (!atomic_compare_exchange_weak_explicit(&pg->thread_free, &old, b, memory_order_release, memory_order_relaxed));
    MLD_RACE_WINDOW();   /* the block is published: nothing of the page may be touched from here on */
    if (unlikely(reap != NULL)) mld_arena_want_reap(reap);
    return;
  }
  if (pg->kind == PAGE_LARGE && p == pg->user) {
    mld_large_free(h, pg, p);
    return;
  }
  mld_report_invalid("free", p);
}

/* ---- fork ---- */
/* The exit heap's lock is taken before the heaps' (it is held while a page is found, which may take them). */
void mld_heaps_lock(void) { mld_exit_heap_lock(); pthread_mutex_lock(&mld_heaps_mutex); }
void mld_heaps_unlock(void) { pthread_mutex_unlock(&mld_heaps_mutex); mld_exit_heap_unlock(); }

/* In the child only the forking thread lives. The other threads' heaps may have been mid-update (their owners
 * change them without locks), so they are left alone: their pages stay allocated in the child, as in jemalloc
 * and mimalloc. Their statistics remain readable. */
void mld_heaps_fork_child(void) {
  pthread_mutex_init(&mld_heaps_mutex, NULL);
  mld_exit_heap_fork_child();
}
