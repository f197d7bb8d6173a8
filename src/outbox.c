/* outbox.c — remote frees: blocks freed by a thread that does not own their page, batched per page and sent with one CAS; the sweep requests they raise. */
#include "internal.h"
#include "secure.h"

/* A batch on a page's thread_free list: its first block's second word holds the batch's last block and its
 * length (tail | count << 48; user addresses fit in 47 bits), so the owner collects a list batch by batch
 * instead of walking every block (mld_page_collect_remote). Every class is at least 16 bytes: two words fit. */

/* Publish `n` blocks of `pg`, linked head..tail, with one CAS on the page's second cache line. Everything
 * this needs from the page is read before the CAS: once the batch is published, the owner (or an adopter or
 * a reaper) may collect it, release the page and reuse its memory, so nothing of the page is touched after. */
void mld_remote_push(page_t *pg, block_t *head, block_t *tail, uint32_t n) {
  heap_t *owner = atomic_load_explicit(&pg->heap, memory_order_relaxed);
  arena_t *reap = owner == NULL ? segment_of(pg)->arena : NULL;
  /* A parked page (its owner allocates elsewhere) or a page of the exit heap (nobody allocates from it but
   * under its lock) may stay unvisited for long: a sweep is asked for, which returns it once it is empty. */
  bool sweep = owner != NULL && (__atomic_load_n(&pg->in_full, __ATOMIC_RELAXED) || owner == &mld_exit_heap);
#ifdef MALLARD_SECURE
  (void)n;   /* the secure variant's owner walks and checks every block as it collects: no count to trust */
#else
  ((uintptr_t *)head)[1] = (uintptr_t)tail | ((uintptr_t)n << MLD_BATCH_COUNT_SHIFT);
#endif
  block_t *old = atomic_load_explicit(&pg->thread_free, memory_order_relaxed);
  do {
    blk_set_next(pg, tail, old);
  } while (!atomic_compare_exchange_weak_explicit(&pg->thread_free, &old, head, memory_order_release,
                                                  memory_order_relaxed));
  MLD_RACE_WINDOW();   /* the batch is published: nothing of the page may be touched from here on */
  if (unlikely(reap != NULL)) mld_arena_want_reap(reap);   /* arenas live for ever */
  else if (unlikely(sweep)) mld_sweep_want();
}

/* ---- sweep requests: raised by sends into pages nobody may visit soon (heap.c: mld_heaps_sweep) ---- */
_Atomic(uint64_t) mld_sweep_since;

void mld_sweep_want(void) {
  if (atomic_load_explicit(&mld_sweep_since, memory_order_relaxed)) return;   /* already asked: one write per delay */
  uint64_t none = 0, now = mld_now_ms();
  if (atomic_compare_exchange_strong(&mld_sweep_since, &none, now ? now : 1)) mld_dirty_notify();
}

uint64_t mld_sweep_due(void) {
  uint64_t since = atomic_load_explicit(&mld_sweep_since, memory_order_relaxed);
  return since ? since + mld_purge_age() : 0;
}

/* Send one entry's batch and empty the slot. */
static void send(outbox_t *e) {
  page_t *pg = e->page;
  e->page = NULL;
  mld_remote_push(pg, e->head, e->tail, e->count);
}

/* Send every pending batch: at thread exit, on a refill, on malloc_trim/mallard_collect, and every
 * MLD_OUTBOX_AGE remote frees (so a batch never waits long while its thread keeps freeing). */
void mld_outbox_flush(heap_t *h) {
  h->outbox_ops = 0;
  for (unsigned i = 0; i < MLD_OUTBOX_SLOTS; i++)
    if (h->outbox[i].page) send(&h->outbox[i]);
}

/* A block of a page this heap does not own: add it to that page's batch. A slot holds one page at a time
 * (direct-mapped by descriptor address); a batch is sent when it holds MLD_OUTBOX_BLOCKS blocks or
 * MLD_OUTBOX_BYTES bytes, so blocks of 8 KiB and more go out at once and at most
 * MLD_OUTBOX_SLOTS * MLD_OUTBOX_BYTES bytes wait in a thread's outbox. */
void mld_outbox_add(heap_t *h, page_t *pg, block_t *b) {
  outbox_t *e = &h->outbox[((uintptr_t)pg / sizeof(page_t)) & (MLD_OUTBOX_SLOTS - 1)];
  uint32_t bs = pg->block_size;
  if (e->page == pg) {
    blk_set_next(pg, b, e->head);   /* encrypted in the secure variant, as on the page's lists */
#ifdef MALLARD_SECURE
    /* The skip hint (secure.h): recent[count % 4] holds the block added four frees ago, which the owner reaches
     * four steps after this one. 16-byte blocks have no second word to spare (their canary is there). */
    if (bs > 16) {
      unsigned i = e->count % MLD_SKIP_DISTANCE;
      if (e->count >= MLD_SKIP_DISTANCE) *skip_word(b) = link_encode(skip_key(pg), e->recent[i]);
      e->recent[i] = b;
    }
#endif
    e->head = b;
    e->count++;
    e->bytes += bs;
  } else {
    if (e->page) send(e);
    b->next = NULL;
    e->page = pg;
    e->head = e->tail = b;
#ifdef MALLARD_SECURE
    e->recent[0] = b;   /* the chain's first block carries no hint (it is the last the owner reaches) */
#endif
    e->count = 1;
    e->bytes = bs;
  }
  if (e->count >= MLD_OUTBOX_BLOCKS || e->bytes >= MLD_OUTBOX_BYTES) send(e);
  if (unlikely(++h->outbox_ops >= MLD_OUTBOX_AGE)) mld_outbox_flush(h);
}
