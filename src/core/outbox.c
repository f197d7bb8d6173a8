/* core/outbox.c — remote frees: blocks freed by a thread that does not own their page, batched per page and sent with one CAS (the secure variant: a bit each, the words' summary bits batched); the sweep and reap requests they raise. */
#include "core/core.h"
#include "core/secure.h"

/* What a remote free must ask for once its blocks are published, read before (nothing of the page is touched
 * after): a reap of its arena when the page's owner exited; a sweep for a page that is not its owner's current
 * one, parked or not (its owner allocates elsewhere: heap.c make_current asks for the frees sent before) or a page
 * of the exit heap (nobody allocates from it but under its lock), which may otherwise stay
 * unvisited for long: a sweep returns it once it is empty. */
typedef struct remote_notice_s {
  arena_t *reap;
  heap_t *owner;   /* the page's owner, when the page is not one of its current ones: it is asked to walk its pages */
  bool sweep;
  bool parked;     /* the page is parked: a sweep may hand it over if its owner is idle (heap.c hand_over) */
} remote_notice_t;

static inline remote_notice_t remote_notice(page_t *pg) {
  heap_t *owner = atomic_load_explicit(&pg->heap, memory_order_relaxed);
  remote_notice_t n = { owner == NULL ? segment_of(pg)->arena : NULL, NULL, false, false };
  n.parked = owner != NULL && __atomic_load_n(&pg->in_full, __ATOMIC_RELAXED);
  n.sweep = owner != NULL && (n.parked || !__atomic_load_n(&pg->is_current, __ATOMIC_RELAXED) || owner == &mld_exit_heap);
  if (n.sweep && owner != &mld_exit_heap) n.owner = owner;
  return n;
}

static inline void remote_notify(remote_notice_t n) {
  if (unlikely(n.reap != NULL)) mld_arena_want_reap(n.reap);   /* arenas live for ever */
  else if (unlikely(n.sweep)) {
    /* Heap structs live for ever (recycled, never unmapped): one recycled since only walks its pages once in vain.
     * Written after the publish: an owner that cleared the flag before walking either collects this batch or is asked
     * again. Read first: a busy page's senders do not bounce the owner's line. */
    if (n.owner && !atomic_load_explicit(&n.owner->reclaim_wanted, memory_order_relaxed))
      atomic_store_explicit(&n.owner->reclaim_wanted, 1, memory_order_relaxed);
    /* Our publish, then mld_sweep_since; the sweeper's exchange, then its walk (mld_heaps_sweep): a release RMW does
     * not keep a later load behind it (aarch64: casl then ldr), so a seq_cst fence on each side makes one of the
     * two see the other: either we see no request pending and ask, or the sweep sees our batch. */
    mld_fence_after_rmw();
    /* Into a parked page of an owner that has not refilled for MLD_HAND_OVER_IDLE_MS (larson's main thread, waiting
     * in pthread_join while its blocks are freed): a sweep soon, which hands such pages over (heap.c hand_over), not
     * one sweep age later, by when the threads freeing into them have filled new pages of their own. */
    if (n.parked && n.owner) {
      uint64_t last = atomic_load_explicit(&n.owner->last_slow_ms, memory_order_relaxed), now = mld_now_ms();
      if (last <= now && now - last >= MLD_HAND_OVER_IDLE_MS) { mld_sweep_want_soon(); return; }
    }
    mld_sweep_want();
  }
}

#ifndef MALLARD_SECURE
/* A batch on a page's thread_free list: its first block's second word holds the batch's last block, so that a
 * collection that must find the list's tail walks it batch by batch, not block by block (mld_page_collect_remote);
 * the list's length is in the thread_free word itself. Every class is at least 16 bytes: two words fit. */

/* Publish `n` blocks of `pg`, linked head..tail, with one CAS on the page's first cache line. Everything this
 * needs from the page is read before the CAS: once the batch is published, the owner (or an adopter or a
 * reaper) may collect it, release the page and reuse its memory, so nothing of the page is touched after. */
void mld_remote_push(page_t *pg, block_t *head, block_t *tail, uint32_t n) {
  remote_notice_t notice = remote_notice(pg);
  /* The batch that brings back the last blocks of a parked page: the page goes back to its arena now (heap.c
   * mld_heap_give_emptied), not when its owner next walks its pages or a sweep or claim finds it. The hint, checked
   * exactly under the owner's lock: the waiting frees and this batch make up every block the page holds (a page is
   * parked when all its blocks are out). `reserved` is not written while the page is in use, which this batch's
   * blocks make it; `used`, written by the owner without a lock, is only read under that lock. */
  if (notice.parked && notice.owner &&
      (atomic_load_explicit(&pg->thread_free, memory_order_relaxed) >> MLD_BATCH_COUNT_SHIFT) + n == pg->reserved &&
      mld_heap_give_emptied(notice.owner, pg, n))
    return;
  ((block_t **)head)[1] = tail;
  /* The list's length rides in the word's top bits: at most the blocks handed out of the page, < 2^16 (page.c). */
  uintptr_t add = (uintptr_t)n << MLD_BATCH_COUNT_SHIFT;
  uintptr_t old = atomic_load_explicit(&pg->thread_free, memory_order_relaxed);
  do {
    blk_set_next(pg, tail, (block_t *)(old & MLD_BATCH_PTR_MASK));
  } while (!atomic_compare_exchange_weak_explicit(&pg->thread_free, &old, (uintptr_t)head | ((old & ~MLD_BATCH_PTR_MASK) + add),
                                                  memory_order_release, memory_order_relaxed));
  MLD_RACE_WINDOW();   /* the batch is published: nothing of the page may be touched from here on */
  remote_notify(notice);
}
#else
/* Publish the bits `summary` of pg's summary word `sword` (the words whose first waiting free this thread made).
 * Until then no block of those words can be collected (no other summary bit names them: secure.h), so the page
 * stays in use: its summary may be written. After, nothing of the page is touched. */
static void publish(page_t *pg, size_t sword, uint64_t summary) {
  remote_notice_t notice = remote_notice(pg);
  atomic_fetch_or_explicit(remote_summary(pg) + sword, summary, memory_order_release);
  MLD_RACE_WINDOW();   /* published: nothing of the page may be touched from here on */
  remote_notify(notice);
}
#endif

/* ---- sweep requests: raised by sends into pages nobody may visit soon (heap.c: mld_heaps_sweep) ----
 * One word: the request's time in ms shifted left by one, with MLD_SWEEP_SOON in bit 0 when it is due after
 * MLD_HAND_OVER_IDLE_MS rather than the sweep age; 0: none. One word, so that the sweep takes a request and its
 * kind at once: kept apart, a sweep that cleared the kind, then took the time, while a sender set the kind and then
 * failed to set the time (a request was pending), left a kind with no time behind, and every later soon request saw
 * it and returned (qemu-user, test_memory_idle idle-owner: 1 run in 8). */
_Atomic(uint64_t) mld_sweep_since;

static uint64_t sweep_stamp(bool soon) {
  uint64_t now = mld_now_ms();
  return (now ? now : 1) << 1 | (soon ? MLD_SWEEP_SOON : 0);   /* never 0 */
}

void mld_sweep_want(void) {
  if (atomic_load_explicit(&mld_sweep_since, memory_order_relaxed)) return;   /* already asked: one write per delay */
  uint64_t none = 0;
  if (atomic_compare_exchange_strong(&mld_sweep_since, &none, sweep_stamp(false))) mld_purge_wake();
}

/* A sweep within MLD_HAND_OVER_IDLE_MS: a pending request becomes a soon one (due at once if older), or one is made;
 * the purging thread is woken to wait for the nearer deadline, once per request. */
void mld_sweep_want_soon(void) {
  uint64_t cur = atomic_load_explicit(&mld_sweep_since, memory_order_relaxed);
  do {
    if (cur & MLD_SWEEP_SOON) return;   /* asked already */
    MLD_RACE_WINDOW();                  /* a sweep may take the request meanwhile: the CAS then fails */
  } while (!atomic_compare_exchange_weak(&mld_sweep_since, &cur, cur ? cur | MLD_SWEEP_SOON : sweep_stamp(true)));
  mld_purge_wake();
}

/* Put back a request the sweep took but that is not due yet, merged with any made meanwhile (the older time, either's
 * soon bit). */
void mld_sweep_keep(uint64_t req) {
  uint64_t cur = 0, merged;
  do {
    merged = !cur ? req : ((cur >> 1 < req >> 1 ? cur : req) & ~(uint64_t)MLD_SWEEP_SOON) | ((cur | req) & MLD_SWEEP_SOON);
  } while (!atomic_compare_exchange_weak(&mld_sweep_since, &cur, merged));
}

/* The age at which a request is due: the sweep age, or the hand-over's for a soon one. */
uint64_t mld_sweep_request_age(uint64_t req) {
  uint64_t age = mld_sweep_age();
  return (req & MLD_SWEEP_SOON) && age > MLD_HAND_OVER_IDLE_MS ? MLD_HAND_OVER_IDLE_MS : age;
}

uint64_t mld_sweep_due(void) {
  uint64_t req = atomic_load_explicit(&mld_sweep_since, memory_order_relaxed);
  return req ? (req >> 1) + mld_sweep_request_age(req) : 0;
}

/* Send one entry's batch (the secure variant: its summary bits) and empty the slot. */
static void send(outbox_t *e) {
  page_t *pg = e->page;
  e->page = NULL;
#ifndef MALLARD_SECURE
  mld_remote_push(pg, e->head, e->tail, e->count);
#else
  publish(pg, e->sword, e->summary);
#endif
}

/* Send every pending batch: at thread exit, on a refill, on malloc_trim/mallard_collect, and every
 * MLD_OUTBOX_AGE remote frees (so a batch never waits long while its thread keeps freeing). */
void mld_outbox_flush(heap_t *h) {
  h->outbox_ops = 0;
  for (unsigned i = 0; i < MLD_OUTBOX_SLOTS; i++)
    if (h->outbox[i].page) send(&h->outbox[i]);
}

#ifndef MALLARD_SECURE
/* A block of a page this heap does not own: add it to that page's batch. A batch is sent when it holds
 * MLD_OUTBOX_BLOCKS blocks or MLD_OUTBOX_BYTES bytes, so blocks of 8 KiB and more go out at once and at most
 * MLD_OUTBOX_SLOTS * MLD_OUTBOX_BYTES bytes wait in a thread's outbox. */
void mld_outbox_add(heap_t *h, page_t *pg, block_t *b) {
  outbox_t *e = mld_outbox_slot(h, pg);
  uint32_t bs = pg->block_size;
  if (e->page == pg) {
    mld_outbox_link(e, b, e->bytes + bs);
  } else {
    if (e->page) send(e);
    b->next = NULL;
    e->page = pg;
    e->head = e->tail = b;
    e->count = 1;
    e->bytes = bs;
  }
  if (e->count >= MLD_OUTBOX_BLOCKS || e->bytes >= MLD_OUTBOX_BYTES) send(e);
  if (unlikely(++h->outbox_ops >= MLD_OUTBOX_AGE)) mld_outbox_flush(h);
}
#else
/* The secure variant's remote free: no chain, and nothing written into the block. Its remote bit, set at once, is
 * the free (a second free by any thread finds it, secure.h); the free that finds the bit's word empty owes the word
 * to the page's summary, where the holder finds it (page.c takes the blocks word by word, checking each). That
 * debt is batched per page like the fast variant's chains: one locked `or` for up to MLD_OUTBOX_WORDS words. */
void mld_remote_free_secure(heap_t *h, page_t *pg, block_t *b) {
  uint64_t sbit = remote_summary_bit(pg, b);
  size_t sword = remote_summary_index(pg, b);   /* < pg->slot_count: b lies in one of the page's slots */
  bool owed = secure_remote_release(pg, b) == 0;   /* else the word is owed or published already */
  if (unlikely(h == &mld_heap_empty)) {   /* a thread past its destructor: at once */
    if (owed) publish(pg, sword, sbit);
    return;
  }
  if (owed) {
    MLD_RACE_WINDOW();   /* the bit is set, its word not yet published: the holder cannot reach the block */
    /* The slot of the descriptor of b's own slot: a multi-slot page's summary words batch in slots of their own. */
    outbox_t *e = mld_outbox_slot(h, pg + sword);
    if (e->page != pg || e->sword != sword) {
      if (e->page) send(e);
      e->page = pg;
      e->sword = (uint32_t)sword;
      e->summary = 0;
      e->count = 0;
    }
    e->summary |= sbit;
    if (++e->count >= MLD_OUTBOX_WORDS) send(e);
  }
  if (unlikely(++h->outbox_ops >= MLD_OUTBOX_AGE)) mld_outbox_flush(h);
}
#endif
