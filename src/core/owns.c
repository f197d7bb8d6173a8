/* core/owns.c — is an address inside a segment's block or a huge block Mallard has now (headers read through hazard.c); mallard_owns (api/api.c) adds the guarded pool. */
#define _GNU_SOURCE
#include "core/core.h"

/* Is p inside a small page or a large block's span of seg, a normal segment whose arena's lock is held? Span marks
 * change only under that lock. The inner slots of a free span keep the marks of the spans they were part of, so the
 * span a slot's offset leads to must still cover that slot. */
static bool in_used_span(const segment_t *seg, const void *p) {
  size_t i = ((uintptr_t)p - (uintptr_t)seg) >> MLD_SLOT_SHIFT;
  if (i < MLD_FIRST_SLOT) return false;   /* the segment header */
  size_t off = seg->pages[i].offset;
  if (off > i - MLD_FIRST_SLOT) return false;
  const page_t *first = &seg->pages[i - off];
  return (first->kind == PAGE_SMALL || first->kind == PAGE_LARGE) && off < first->slot_count;
}

/* p lies in seg, a normal segment of arena a when it was peeked at. Under a's lock, a segment still marked and
 * still a's cannot be released (mld_segment_release runs under that lock) and its span marks are stable. */
static bool owns_in_segment(segment_t *seg, arena_t *a, const void *p) {
  for (;;) {
    pthread_mutex_lock(&a->lock);
    arena_t *now = NULL;
    int kind = mld_owns_peek(seg, &now);
    bool in = kind == SEG_NORMAL && now == a && in_used_span(seg, p);
    pthread_mutex_unlock(&a->lock);
    if (kind == SEG_NORMAL && now == a) return in;
    if (kind != SEG_NORMAL) return mld_huge_find(p) != NULL;   /* released meanwhile: a huge mapping may be there now */
    a = now;   /* released, and mapped again by another arena */
  }
}

/* True exactly for addresses inside small pages, large blocks' spans and huge blocks' usable bytes that Mallard has
 * now; any other address (foreign, freed, unmapped a moment ago) is false. Never reads memory that may be gone. */
bool mld_owns(const void *p) {
  segment_t *seg = segment_of(p);
  arena_t *a = NULL;
  if (p && mld_owns_peek(seg, &a) == SEG_NORMAL) return owns_in_segment(seg, a, p);
  return mld_huge_find(p) != NULL;   /* a huge block starting at p's granule or below, or one aligned beyond a segment */
}
