/* prof/prof.h — heap profiling: options, the allocation-path sampling countdown, sample records, dumps (prof.c). */
#ifndef MALLARD_PROF_H
#define MALLARD_PROF_H

#include "core/core.h"

#define MLD_PROF_PREFIX_MAX 256
#define MLD_PROF_DEPTH 64                   /* frames kept per stack (innermost first) */

/* The profiler's options (MALLARD_CONF prof*; parsed by options.c, read by prof.c and ctl.c). */
typedef struct prof_options_s {
  bool prof;                                /* profiler present (start-up only; prof:false can never sample) */
  bool active;                              /* sampling on (writable at run time through prof.active) */
  bool final;                               /* dump PREFIX.PID.final.pb.gz at exit */
  bool leak;                                /* leak summary on stderr at exit */
  size_t sample;                            /* mean bytes allocated between samples (>= 1) */
  size_t interval;                          /* dump each time this many bytes (estimated) were allocated; 0: off */
  int signal;                               /* dump when this signal arrives; 0: none */
  char signame[16];                         /* its name as printed: SIGUSR2, or none */
  uint64_t seed;                            /* sampling seed (tests); 0: random */
  char prefix[MLD_PROF_PREFIX_MAX];         /* dump files: PREFIX.PID.SEQ.pb.gz */
} prof_options_t;

extern prof_options_t mld_prof_opt MLD_HIDDEN;
MLD_HIDDEN void mld_prof_options_defaults(void);

/* The sampling countdown: bytes still to be allocated by this thread before the next sampled byte. Every allocation
 * subtracts its request size; when it goes negative the allocation takes the slow path (mld_prof_take). A new
 * thread's countdown is -1, so its first allocation (of any size) initialises it; with prof:false it is set to
 * 2^63-1. */
#ifdef MLD_TLS_PROF_LEFT   /* internal.h keeps it beside the heap pointer: one TLS address serves both */
#define mld_prof_left MLD_TLS_PROF_LEFT
#else
extern __thread uint64_t mld_prof_left MLD_HIDDEN;
#endif
static inline bool mld_prof_tick(size_t size) { return unlikely((int64_t)(mld_prof_left -= size) < 0); }

/* Slow path of the countdown: true when this allocation of `size` bytes is to be sampled (the caller then serves it
 * as a large block, which always takes the slow free path, and calls mld_prof_record). Redraws the countdown. */
MLD_HIDDEN bool mld_prof_take(size_t size);
/* Records sampled block p of `size` requested bytes; ra: the return address into the allocator's caller. */
MLD_HIDDEN void mld_prof_record(void *p, size_t size, const void *ra);

/* Live sampled blocks; non-zero only while some are recorded. Frees of large and huge blocks look them up. */
extern _Atomic(uint64_t) mld_prof_nlive MLD_HIDDEN;
MLD_HIDDEN void mld_prof_forget_slow(const void *p);
/* Before a large or huge block is given back (before: once freed, its address may be handed out and sampled again). */
static inline void mld_prof_forget(const void *p) {
  if (unlikely(atomic_load_explicit(&mld_prof_nlive, memory_order_relaxed) != 0)) mld_prof_forget_slow(p);
}
/* A sampled block's record, taken out while its block moves (huge realloc) and put back at its new address (unless a
 * prof.reset came in between: gen is the reset count when it was taken out). */
typedef struct prof_rec_s { void *stack; double weight; uint64_t size, gen; } prof_rec_t;
MLD_HIDDEN bool mld_prof_detach(const void *p, prof_rec_t *out);
MLD_HIDDEN void mld_prof_attach(const void *p, const prof_rec_t *rec);

/* Control (ctl.c). */
typedef struct prof_stats_s {
  uint64_t samples;                         /* samples taken since start or the last reset */
  uint64_t bytes_sampled;                   /* their requested bytes (raw, not scaled) */
  uint64_t stacks;                          /* distinct stacks stored */
  uint64_t live;                            /* sampled blocks still live */
  uint64_t metadata;                        /* bytes the profiler has mapped for its tables */
  uint64_t dumps;                           /* profiles written */
} prof_stats_t;
MLD_HIDDEN void mld_prof_stats(prof_stats_t *out);
MLD_HIDDEN bool mld_prof_is_active(void);
MLD_HIDDEN size_t mld_prof_mean(void);                    /* bytes between samples in force */
MLD_HIDDEN bool mld_prof_set_active(bool on);            /* false: prof:false */
MLD_HIDDEN bool mld_prof_set_sample(size_t mean);        /* false: bad value or prof:false */
MLD_HIDDEN int mld_prof_dump(const char *path);          /* 0 or an errno value; NULL: the next PREFIX.PID.SEQ name */
MLD_HIDDEN bool mld_prof_reset(size_t mean);             /* mean 0: keep the rate */
MLD_HIDDEN void mld_prof_signal_name(int sig, char *out, size_t len);   /* "SIGUSR2"; "none" for 0 */
MLD_HIDDEN int mld_prof_signal_parse(const char *v, size_t n);   /* signal number, 0 for none, -1 if refused */

#endif

/* ---- between the profiler's own files (prof.c, prof_stack.c, prof_dump.c) ---- */
typedef struct prof_stack_s {
  struct prof_stack_s *next;                /* hash chain */
  uint64_t hash;
  uint32_t depth;
  double alloc_objects, alloc_space;        /* unbiased estimates since start or the last reset */
  double inuse_objects, inuse_space;
  uintptr_t pcs[];                          /* return addresses, innermost first */
} prof_stack_t;

MLD_HIDDEN void mld_prof_lock(void);
MLD_HIDDEN void mld_prof_unlock(void);
MLD_HIDDEN bool mld_prof_safe_context(void);               /* no dlopen in progress, not forking: may load and start things */
/* prof_stack.c */
MLD_HIDDEN void mld_prof_unwinder_load(void);              /* once, in a safe context, no lock held */
MLD_HIDDEN unsigned mld_prof_backtrace(uintptr_t *pcs, unsigned max, uintptr_t ra);
/* prof.c: a copy of every stack with non-zero counts, in memory mapped for it (munmap(*out, *bytes) when done). */
typedef struct prof_snap_s { const prof_stack_t *st; double ao, as, io, is; } prof_snap_t;
MLD_HIDDEN size_t mld_prof_snapshot(prof_snap_t **out, size_t *bytes);
/* The same, with the time its counts start from (CLOCK_REALTIME ns at the start or the last reset; read with them). */
MLD_HIDDEN size_t mld_prof_snapshot_at(prof_snap_t **out, size_t *bytes, int64_t *start_ns);
/* prof_dump.c */
MLD_HIDDEN void mld_prof_dump_boot(void);                  /* at profiler start: signal handler */
MLD_HIDDEN void mld_prof_dump_after_sample(double est_bytes);   /* interval and signal dumps; no lock held */
MLD_HIDDEN void mld_prof_dump_fork_child(void);
MLD_HIDDEN uint64_t mld_prof_dumps(void);                  /* profiles written */
