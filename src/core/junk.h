/* core/junk.h — debug fills (option junk:alloc|free|true|false, glibc's MALLOC_PERTURB_, jemalloc's opt.junk): patterns. */
#ifndef MALLARD_JUNK_H
#define MALLARD_JUNK_H
#include "core/core.h"

#define MLD_JUNK_ALLOC 1                 /* mld_opt.junk: new blocks (not calloc's) are filled with MLD_JUNK_ALLOC_BYTE */
#define MLD_JUNK_FREE 2                  /* mld_opt.junk: freed blocks are filled with MLD_JUNK_FREE_BYTE */
#define MLD_JUNK_ALLOC_BYTE 0xa5         /* jemalloc's: a pointer made of it is non-canonical, an int negative */
#define MLD_JUNK_FREE_BYTE 0x5a

/* Where the fills happen, at no cost with junk off (docs/OPTIONS.md): allocations reach api.c's prof_alloc through
 * the profiler's countdown, held negative while junk includes alloc; owner frees of small blocks take the slow
 * path through the page's junk_free byte, which the fast path tests with in_full in one instruction; remote,
 * large and huge frees are slow paths that test mld_opt.junk. */
static inline bool mld_junk_free_on(void) { return unlikely(mld_opt.junk & MLD_JUNK_FREE); }
#endif
