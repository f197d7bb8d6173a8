/* platform/platform.h — the platform layer: everything that differs between machines and C libraries (mappings,
 * purging, protection, clocks, CPU count, messages, CPU hints); the layers above reach the OS only through it. */
#ifndef MALLARD_PLATFORM_H
#define MALLARD_PLATFORM_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>
#include <sched.h>

#define MLD_EXPORT __attribute__((visibility("default")))
#define MLD_HIDDEN __attribute__((visibility("hidden")))
#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)
#define MLD_NOINLINE __attribute__((noinline))
#define MLD_CACHE_LINE 64
#define MLD_OS_PAGE 4096                                  /* the smallest page of the machines supported today */

/* os.c: mappings, purging, clocks, CPU count */
/* hint: an address to try first (0: just below the previous aligned mapping) */
MLD_HIDDEN void *mld_os_map_aligned(size_t size, size_t align, uintptr_t hint);
MLD_HIDDEN void mld_os_unmap(void *p, size_t size);
MLD_HIDDEN bool mld_os_purge(void *p, size_t size);               /* false: the memory was not released */
MLD_HIDDEN void mld_os_thp(void *p, size_t size, int advice);       /* 1: huge pages, -1: none, 0: the default */
MLD_HIDDEN void *mld_os_remap(void *old, size_t old_size, size_t new_size, size_t align);
MLD_HIDDEN void *mld_os_move(void *old, size_t size, size_t align);   /* NULL: not moved (still at old) */
MLD_HIDDEN bool mld_os_init(void);
MLD_HIDDEN void mld_os_name(void *p, size_t size, const char *name);
MLD_HIDDEN uint64_t mld_now_ms(void);
MLD_HIDDEN size_t mld_ncpus(void);
extern _Atomic(uint64_t) mld_mapped_bytes MLD_HIDDEN;

/* One step of xorshift64* over *state (non-zero): the samplers' draws (prof.c, guarded.c), which need no secret. */
static inline uint64_t mld_xorshift64s(uint64_t *state) {
  uint64_t x = *state;
  x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
  *state = x;
  return x * 0x2545F4914F6CDD1DULL;
}

/* diag.c */
MLD_HIDDEN void mld_report_invalid(const char *what, const void *p);
extern _Atomic(uint64_t) mld_invalid_count MLD_HIDDEN;
MLD_HIDDEN void mld_message(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
MLD_HIDDEN void mld_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/* ---- race-window widening (test builds with MALLARD_RACE_DELAY): a short random pause where memory changes hands */
#ifdef MALLARD_RACE_DELAY
MLD_HIDDEN void mld_race_delay(void);
#define MLD_RACE_WINDOW() mld_race_delay()
#else
#define MLD_RACE_WINDOW() ((void)0)
#endif

/* ---- a spin lock for locks that are almost never contended (the heap lock: its owner against a sweep) ---- */
static inline bool mld_spin_trylock(_Atomic(int) *l) {
  return !atomic_load_explicit(l, memory_order_relaxed) && !atomic_exchange_explicit(l, 1, memory_order_acquire);
}
static inline void mld_spin_lock(_Atomic(int) *l) {
  while (!mld_spin_trylock(l)) sched_yield();   /* held by a sweep (or another exiting thread): short */
}
static inline void mld_spin_unlock(_Atomic(int) *l) { atomic_store_explicit(l, 0, memory_order_release); }

#endif
