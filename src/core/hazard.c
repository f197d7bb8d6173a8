/* core/hazard.c — the segment ownership map, and hazard slots: how a header of a segment found in it is read while others may unmap it. */
#define _GNU_SOURCE
#include "core/core.h"
#include <sched.h>

/* The ownership map says that a segment header starts at a granule, but another thread may unmap that segment
 * (mld_segment_release under its arena's lock, a huge free, the huge cache) or reuse its header as block memory (a
 * merge in the huge cache) right after the bit was read. So a reader first claims a slot naming the granule, then
 * reads the bit, and reads the header only if the bit is set; whoever clears a bit (mld_owner_set, before any of
 * those) then waits in mld_owns_quiesce until no slot names that granule with a claim made before the clearing.
 * Both sides are sequentially consistent: either the reader sees the bit clear, or the clearer sees the claim.
 * Readers never wait on anything while they hold a slot; a clearer waits only for readers of that very granule, and
 * only for claims already there (every claim has its own value), so a stream of new readers cannot hold it up. */
#define OWNS_SLOTS 32
#define SLOT_GRANULE 0xffffffffull   /* low half of a slot: granule + 1 while a reader holds it, 0 when free */
#define SLOT_CLAIM (SLOT_GRANULE + 1)  /* high half: claims made of the slot, so that no two claims look alike */

static struct {
  _Atomic(uint64_t) v;
  char pad_[MLD_CACHE_LINE - sizeof(uint64_t)];
} slots[OWNS_SLOTS] __attribute__((aligned(MLD_CACHE_LINE)));

static unsigned slot_claim(uintptr_t g) {
  unsigned i = (unsigned)(((uint64_t)(uintptr_t)pthread_self() * 0x9E3779B97F4A7C15ull) >> 59) % OWNS_SLOTS;
  for (unsigned tries = 1;; tries++, i = (i + 1) % OWNS_SLOTS) {
    uint64_t v = atomic_load_explicit(&slots[i].v, memory_order_relaxed);
    if (!(v & SLOT_GRANULE) &&
        atomic_compare_exchange_strong_explicit(&slots[i].v, &v, ((v & ~SLOT_GRANULE) + SLOT_CLAIM) | (g + 1),
                                                memory_order_seq_cst, memory_order_relaxed))
      return i;
    if (tries % OWNS_SLOTS == 0) sched_yield();   /* every slot taken: their readers are a few loads from done */
  }
}

static void slot_leave(unsigned i) {
  uint64_t v = atomic_load_explicit(&slots[i].v, memory_order_relaxed);   /* ours: nobody else writes it now */
  atomic_store_explicit(&slots[i].v, v & ~SLOT_GRANULE, memory_order_release);
}

int mld_owns_peek(const void *seg, arena_t **arena) {
  uintptr_t g = (uintptr_t)seg >> MLD_SEGMENT_SHIFT;
  if (!mld_owned(seg)) return 0;   /* a first look, without a slot (also rejects granules beyond the map) */
  unsigned i = slot_claim(g);
  int kind = 0;
  if ((atomic_load_explicit(&mld_owner_map[g >> 6], memory_order_seq_cst) >> (g & 63)) & 1) {
    MLD_RACE_WINDOW();   /* whoever clears the bit now must wait for this slot before unmapping the header */
    const segment_t *s = seg;
    kind = (int)s->kind;   /* kind and arena are written before the bit is set and not changed while it is */
    if (arena) *arena = s->arena;
  }
  slot_leave(i);
  return kind;
}

void mld_owns_quiesce(const void *seg) {
  uint64_t g1 = ((uintptr_t)seg >> MLD_SEGMENT_SHIFT) + 1;
  for (unsigned i = 0; i < OWNS_SLOTS; i++) {
    uint64_t v = atomic_load_explicit(&slots[i].v, memory_order_seq_cst);
    if ((v & SLOT_GRANULE) != g1) continue;
    while (atomic_load_explicit(&slots[i].v, memory_order_acquire) == v) sched_yield();
  }
}

/* In the child of fork only the forking thread runs: slots held by the parent's other threads are nobody's. */
void mld_owns_fork_child(void) {
  for (unsigned i = 0; i < OWNS_SLOTS; i++) atomic_store_explicit(&slots[i].v, 0, memory_order_relaxed);
}

/* ---- the ownership map: set when a segment is mapped, cleared (then quiesced) before it is unmapped or reused ---- */
_Atomic(uint64_t) mld_owner_map[MLD_OWNER_WORDS];   /* one bit per 4 MiB granule: a segment header starts there */

void mld_owner_set(const void *seg, bool on) {
  uintptr_t g = (uintptr_t)seg >> MLD_SEGMENT_SHIFT;
  if (g >= ((uintptr_t)1 << (MLD_ADDR_BITS - MLD_SEGMENT_SHIFT))) return;
  uint64_t bit = (uint64_t)1 << (g & 63);
  if (on) atomic_fetch_or_explicit(&mld_owner_map[g >> 6], bit, memory_order_release);
  else {
    atomic_fetch_and_explicit(&mld_owner_map[g >> 6], ~bit, memory_order_seq_cst);   /* seq_cst: see owns.c */
    mld_owns_quiesce(seg);   /* no reader of the header is left: it may be unmapped, moved or reused */
  }
}
