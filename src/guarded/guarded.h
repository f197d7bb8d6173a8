/* guarded/guarded.h — sampled guarded allocations (guard_sample, GWP-ASan's idea): a pool of one-page slots between guard
 * pages, its sampling draws, and the fault handler that reports overflows and uses after free (guarded.c). */
#ifndef MALLARD_GUARDED_H
#define MALLARD_GUARDED_H
#include "core/core.h"

#define MLD_GUARD_MAX_SIZE mld_os_page()        /* larger requests (or alignments) are never guarded */
#define MLD_GUARD_SLOTS_MAX 4096                /* bound of guard_slots */
#define MLD_GUARD_DEPTH 16                      /* frames kept per allocation and per free stack */
#define MLD_GUARD_SAMPLE_MAX ((size_t)1 << 40)  /* bound of guard_sample (bytes) */
enum { MLD_GUARD_ABORT = 0, MLD_GUARD_REPORT = 1 };   /* guard_action */

/* Defaults (options.c; docs/OPTIONS.md gives the measurement they come from): a build may change them with -D. */
#ifndef MLD_GUARD_SAMPLE_DEFAULT
#ifdef MALLARD_SECURE
#define MLD_GUARD_SAMPLE_DEFAULT (64u << 20)    /* mean bytes allocated between guarded samples */
#else
#define MLD_GUARD_SAMPLE_DEFAULT 0              /* 0: off */
#endif
#endif
#ifndef MLD_GUARD_SLOTS_DEFAULT
#define MLD_GUARD_SLOTS_DEFAULT 128
#endif

/* The pool's address range: [mld_guard_base, mld_guard_base + mld_guard_len), 0 until the pool is made. A block
 * Mallard's ownership map does not know is looked up here first (free, realloc, usable size): slow paths only. */
extern _Atomic(uintptr_t) mld_guard_base MLD_HIDDEN;
extern size_t mld_guard_len MLD_HIDDEN;         /* written once, before mld_guard_base is published */
static inline bool mld_guard_owns(const void *p) {
  uintptr_t b = atomic_load_explicit(&mld_guard_base, memory_order_acquire);
  return b && (uintptr_t)p - b < mld_guard_len;
}

/* The countdown's slow path for guard sampling (api.c keeps it beside the profiler's: prof.h): true when this
 * allocation of `size` bytes is to be guarded; *left gets the bytes to the next guarded sample: uniform in
 * [1, 2 * guard_sample - 1], so the mean is guard_sample and no run of allocations of s bytes goes longer than
 * 2 * guard_sample / s allocations without a sample; INT64_MAX when guard_sample is 0. */
MLD_HIDDEN bool mld_guard_take(size_t size, uint64_t *left);
/* A guarded block of `size` bytes (1..MLD_GUARD_MAX_SIZE) aligned to `align` (<= the page), its end as close to
 * the guard page after it as alignment allows; zero: the bytes are zero. NULL when the request does not fit a slot or
 * no slot is free (the caller then serves it as usual). ra: the return address into the allocator's caller. */
MLD_HIDDEN void *mld_guard_alloc(size_t size, size_t align, bool zero, const void *ra);
/* Frees p (mld_guard_owns(p) is true): the slack check, the free stack, PROT_NONE; a double or invalid free is
 * reported. ra: a return address on the freeing path, where the free stack starts. */
MLD_HIDDEN void mld_guard_free(void *p, const void *ra);
/* The block's requested size; 0 after a report when p is not a live guarded block (mld_guard_owns(p) is true). */
MLD_HIDDEN size_t mld_guard_size(const void *p, const char *what);

typedef struct guard_stats_s {
  uint64_t samples;                            /* guarded blocks handed out */
  uint64_t live;                               /* of them, not yet freed */
  uint64_t skipped;                            /* sampled but served as usual (too large, or no free slot) */
  uint64_t reports;                            /* errors reported */
  uint64_t slots;                              /* slots in the pool (0 until it is made) */
} guard_stats_t;
MLD_HIDDEN void mld_guard_stats(guard_stats_t *out);
MLD_HIDDEN void mld_guard_note_skipped(void);

/* init.c's fork handlers: the pool lock is taken with the others. */
MLD_HIDDEN void mld_guard_fork_prepare(void);
MLD_HIDDEN void mld_guard_fork_parent(void);
MLD_HIDDEN void mld_guard_fork_child(void);
#endif
