/* prof/prof.c — heap profiling's sampling and records: the countdown's draws and weights, the stack table and the table of
 * live sampled blocks, in memory the profiler maps itself (never malloc). */
#define _GNU_SOURCE
#include "prof/prof.h"
#include <link.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

prof_options_t mld_prof_opt;
#ifndef MLD_TLS_PROF_LEFT
#ifndef MLD_TLS_PROF_LEFT   /* else it lives beside the heap pointer (internal.h: mld_tls) */
__thread uint64_t mld_prof_left = (uint64_t)-1;   /* negative in a new thread: its first allocation initialises it */
#endif
#endif
static __thread uint64_t tls_rng;            /* xorshift64* state; 0: this thread's countdown not drawn yet */
static __thread bool tls_fork_holder;        /* this thread holds the profiler lock for fork() */
_Atomic(uint64_t) mld_prof_nlive;
static int64_t prof_start_ns;                /* CLOCK_REALTIME at start or the last reset (written under the lock) */

static pthread_mutex_t prof_mutex = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(int) boot_state;              /* 0 not yet, 1 in progress, 2 done */
static _Atomic(bool) prof_active;
static _Atomic(size_t) prof_mean;            /* mean bytes between samples, in force */
static _Atomic(uint64_t) seed_ordinal;       /* threads seeded so far (fixed seeds: thread n gets seed + n) */

/* Counters, under the lock. */
static uint64_t st_samples, st_bytes, st_stacks, st_metadata;
static uint64_t reset_gen;                   /* prof.reset calls so far (under the lock): a detached record's epoch */

void mld_prof_options_defaults(void) {
  memset(&mld_prof_opt, 0, sizeof mld_prof_opt);
  mld_prof_opt.active = true;
  mld_prof_opt.sample = 512 * 1024;
  memcpy(mld_prof_opt.prefix, "mallard", 8);
  memcpy(mld_prof_opt.signame, "none", 5);
}

/* ---- the lock: fork-aware (the forking thread holds it from prepare to parent/child and takes it no further) ---- */
void mld_prof_lock(void) { if (!tls_fork_holder) pthread_mutex_lock(&prof_mutex); }
void mld_prof_unlock(void) { if (!tls_fork_holder) pthread_mutex_unlock(&prof_mutex); }

#ifdef __GLIBC__
/* A dlopen in progress (r_state RT_ADD/RT_DELETE): a nested dlopen would fail glibc's consistency assertion. */
bool mld_prof_safe_context(void) { return !tls_fork_holder && _r_debug.r_state == RT_CONSISTENT; }
#else
/* musl: its loader allocates with its own internal malloc, never the program's, so no sample is taken inside it; it
 * runs constructors after releasing its lock, and a dlopen or dladdr of another thread waits for that lock instead
 * of asserting (a static program cannot dlopen at all). Only the fork window is unsafe. */
bool mld_prof_safe_context(void) { return !tls_fork_holder; }
#endif

static void fork_prepare(void) {
  pthread_mutex_lock(&prof_mutex);
  tls_fork_holder = true;
}
static void fork_parent(void) {
  tls_fork_holder = false;
  pthread_mutex_unlock(&prof_mutex);
}
static void fork_child(void) {
  tls_fork_holder = false;
  pthread_mutex_init(&prof_mutex, NULL);
  mld_prof_dump_fork_child();
}

/* ---- arithmetic without libm: ln(u) for u in (0, 1] and exp(-x) for x >= 0, to ~1e-15 relative ---- */
static double ln(double u) {
  uint64_t bits;
  memcpy(&bits, &u, 8);
  int e = (int)((bits >> 52) & 0x7ff) - 1023;          /* u is normal: it comes from a 53-bit integer / 2^53 */
  bits = (bits & ~(0x7ffULL << 52)) | (1023ULL << 52);   /* mantissa in [1, 2) */
  double m;
  memcpy(&m, &bits, 8);
  if (m > 1.4142135623730951) { m /= 2; e++; }          /* m in [0.707, 1.414]: |s| <= 0.172 */
  double s = (m - 1) / (m + 1), s2 = s * s, term = s, sum = 0;
  for (int k = 1; k <= 25; k += 2) { sum += term / k; term *= s2; }   /* 2 atanh(s) = ln m */
  return 2 * sum + e * 0.6931471805599453;
}

static double exp_neg(double x) {
  if (x > 700) return 0;
  int k = (int)(x / 0.6931471805599453);
  double r = x - k * 0.6931471805599453;                 /* exp(-x) = 2^-k exp(-r), r in [0, ln 2) */
  double term = 1, sum = 1;
  for (int i = 1; i <= 22; i++) { term *= -r / i; sum += term; }
  uint64_t scale = (uint64_t)(1023 - k) << 52;           /* 2^-k, k <= 1010: a normal double */
  double f;
  memcpy(&f, &scale, 8);
  return sum * f;
}

/* 1 / P(an allocation of `size` bytes is sampled) = 1 / (1 - exp(-size/mean)): sampling points form a Poisson process
 * of rate 1/mean per byte, so weighting each sample by this makes counts and bytes unbiased (as pprof, tcmalloc and
 * jemalloc scale). 1 - exp(-x) is summed directly for small x, where the subtraction would lose digits. */
static double weight_of(size_t size, size_t mean) {
  double x = (double)size / (double)mean;
  double p;
  if (x < 1e-3) p = x * (1 - x / 2 * (1 - x / 3 * (1 - x / 4)));
  else p = 1 - exp_neg(x);
  return p > 0 ? 1 / p : 1;
}

static uint64_t rng_next(void) { return mld_xorshift64s(&tls_rng); }

static void rng_seed(void) {
  uint64_t n = atomic_fetch_add(&seed_ordinal, 1);
  uint64_t ns = mld_now_ns();   /* not a secret: only has to differ between threads and runs */
  uint64_t s = mld_prof_opt.seed ? mld_prof_opt.seed + n * 0x9E3779B97F4A7C15ULL
                                 : ((ns % 1000000000u) << 20) ^ (ns / 1000000000u) ^
                                       ((uintptr_t)&tls_rng * 0x9E3779B97F4A7C15ULL) ^ n;
  s ^= s >> 31; s *= 0xBF58476D1CE4E5B9ULL; s ^= s >> 29;   /* spread a small seed over all bits */
  tls_rng = s ? s : 1;
}

/* The next distance: exponential with mean `mean` bytes (so that every byte has the same chance of being sampled). */
static uint64_t draw(void) {
  double u = (double)((rng_next() >> 11) + 1) / 9007199254740992.0;   /* (0, 1] */
  double d = -ln(u) * (double)atomic_load_explicit(&prof_mean, memory_order_relaxed);
  return d >= 4.0e18 ? (uint64_t)4e18 : (uint64_t)d;
}

static void boot(void) {
  int expect = 0;
  if (!atomic_compare_exchange_strong(&boot_state, &expect, 1)) return;
  atomic_store(&prof_active, mld_prof_opt.active);
  atomic_store(&prof_mean, mld_prof_opt.sample ? mld_prof_opt.sample : 1);
  prof_start_ns = (int64_t)mld_realtime_ns();   /* before boot_state 2 publishes it */
  mld_self_alloc = true;                       /* pthread_atfork may allocate */
  pthread_atfork(fork_prepare, fork_parent, fork_child);
  mld_prof_dump_boot();
  mld_self_alloc = false;
  atomic_store(&boot_state, 2);
}

bool mld_prof_take(size_t size) {
  if (mld_self_alloc) { mld_prof_left = 0; return false; }     /* the profiler's own allocations: never sampled */
  mld_ensure_init();
  if (!mld_prof_opt.prof) { mld_prof_left = INT64_MAX; return false; }
  if (atomic_load_explicit(&boot_state, memory_order_acquire) != 2) {
    boot();
    if (atomic_load_explicit(&boot_state, memory_order_acquire) != 2) { mld_prof_left = 0; return false; }
  }
  if (!tls_rng) {                             /* this thread's first draw: does it fall inside this allocation? */
    rng_seed();
    uint64_t d = draw();
    if (d >= size) { mld_prof_left = d - size; return false; }
  }
  mld_prof_left = draw();
  return atomic_load_explicit(&prof_active, memory_order_relaxed);
}

/* ---- memory: chunks mapped for the profiler, carved in order; never returned (stacks live as long as the process) ---- */
static uint8_t *chunk_cur, *chunk_end;
#define CHUNK (256 * 1024)

static void *os_map(size_t bytes) {
  void *p = mld_os_map_plain(bytes, true);
  if (!p) return NULL;
  st_metadata += bytes;
  return p;
}
static void os_unmap(void *p, size_t bytes) { mld_os_unmap_plain(p, bytes); st_metadata -= bytes; }

static void *carve(size_t bytes) {             /* lock held */
  bytes = (bytes + 15) & ~(size_t)15;
  if (bytes > (size_t)(chunk_end - chunk_cur)) {
    uint8_t *c = os_map(CHUNK);
    if (!c) return NULL;
    chunk_cur = c;
    chunk_end = c + CHUNK;
  }
  void *p = chunk_cur;
  chunk_cur += bytes;
  return p;
}

/* ---- stacks, deduplicated by hash (chained; the bucket array doubles when the chains grow long) ---- */
static prof_stack_t **stack_tab;
static size_t stack_cap;                      /* buckets, a power of two */

static uint64_t hash_pcs(const uintptr_t *pcs, unsigned n) {
  uint64_t h = 0x84222325cbf29ce4ULL ^ n;
  for (unsigned i = 0; i < n; i++) { h ^= pcs[i]; h *= 0x100000001b3ULL; h ^= h >> 29; }
  return h;
}

static bool stack_grow(void) {
  size_t ncap = stack_cap ? stack_cap * 2 : 1024;
  prof_stack_t **nt = os_map(ncap * sizeof *nt);
  if (!nt) return false;
  for (size_t i = 0; i < stack_cap; i++)
    for (prof_stack_t *s = stack_tab[i], *next; s; s = next) {
      next = s->next;
      s->next = nt[s->hash & (ncap - 1)];
      nt[s->hash & (ncap - 1)] = s;
    }
  if (stack_tab) os_unmap(stack_tab, stack_cap * sizeof *stack_tab);
  stack_tab = nt;
  stack_cap = ncap;
  return true;
}

static prof_stack_t *stack_intern(const uintptr_t *pcs, unsigned n) {   /* lock held */
  uint64_t h = hash_pcs(pcs, n);
  if (stack_cap)
    for (prof_stack_t *s = stack_tab[h & (stack_cap - 1)]; s; s = s->next)
      if (s->hash == h && s->depth == n && !memcmp(s->pcs, pcs, n * sizeof *pcs)) return s;
  if (st_stacks >= stack_cap && !stack_grow() && !stack_cap) return NULL;
  prof_stack_t *s = carve(sizeof *s + n * sizeof *pcs);
  if (!s) return NULL;
  s->hash = h;
  s->depth = n;
  memcpy(s->pcs, pcs, n * sizeof *pcs);
  s->next = stack_tab[h & (stack_cap - 1)];
  stack_tab[h & (stack_cap - 1)] = s;
  st_stacks++;
  return s;
}

/* ---- live sampled blocks: open addressing (linear probing, tombstones), keyed by the block's address ----
 * A counting filter in front lets a free of a large block that was not sampled skip the lock: a block's filter slot
 * is incremented (under the lock) before the block is handed out and decremented when its record goes. */
typedef struct live_s { uintptr_t key; prof_stack_t *st; double w; uint64_t size; } live_t;
#define LIVE_EMPTY 0
#define LIVE_TOMB 1
static live_t *live_tab;
static size_t live_cap, live_used, live_tombs;   /* used: live records */
#define FILTER_BITS 12
static _Atomic(uint32_t) filter[1u << FILTER_BITS];

static size_t live_hash(uintptr_t k) { return (size_t)((k >> 4) * 0x9E3779B97F4A7C15ULL >> 20); }
static unsigned filter_slot(uintptr_t k) { return (unsigned)((k >> 4) * 0xD6E8FEB86659FD93ULL >> (64 - FILTER_BITS)); }

static void live_put(live_t *tab, size_t cap, const live_t *e) {
  for (size_t i = live_hash(e->key) & (cap - 1);; i = (i + 1) & (cap - 1))
    if (tab[i].key <= LIVE_TOMB) { tab[i] = *e; return; }
}

static bool live_rehash(void) {
  size_t ncap = live_cap ? live_cap : 1024;
  while ((live_used + 1) * 2 > ncap) ncap *= 2;    /* at most half full after a rehash */
  live_t *nt = os_map(ncap * sizeof *nt);
  if (!nt) return false;
  for (size_t i = 0; i < live_cap; i++) if (live_tab[i].key > LIVE_TOMB) live_put(nt, ncap, &live_tab[i]);
  if (live_tab) os_unmap(live_tab, live_cap * sizeof *live_tab);
  live_tab = nt;
  live_cap = ncap;
  live_tombs = 0;
  return true;
}

static bool live_insert(const live_t *e) {     /* lock held */
  if ((live_used + live_tombs + 1) * 4 > live_cap * 3 && !live_rehash()) return false;
  live_put(live_tab, live_cap, e);
  live_used++;
  atomic_fetch_add_explicit(&filter[filter_slot(e->key)], 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&mld_prof_nlive, 1, memory_order_relaxed);
  return true;
}

static bool live_remove(uintptr_t k, live_t *out) {   /* lock held */
  if (!live_cap) return false;
  for (size_t i = live_hash(k) & (live_cap - 1);; i = (i + 1) & (live_cap - 1)) {
    if (live_tab[i].key == LIVE_EMPTY) return false;
    if (live_tab[i].key == k) {
      *out = live_tab[i];
      live_tab[i].key = LIVE_TOMB;
      live_used--;
      live_tombs++;
      atomic_fetch_sub_explicit(&filter[filter_slot(k)], 1, memory_order_relaxed);
      atomic_fetch_sub_explicit(&mld_prof_nlive, 1, memory_order_relaxed);
      return true;
    }
  }
}

/* ---- recording ---- */
void mld_prof_record(void *p, size_t size, const void *ra) {
  bool was_busy = mld_self_alloc;
  mld_self_alloc = true;
  if (mld_prof_safe_context()) mld_prof_unwinder_load();
  uintptr_t pcs[MLD_PROF_DEPTH];
  unsigned n = mld_prof_backtrace(pcs, MLD_PROF_DEPTH, (uintptr_t)ra);
  double w = weight_of(size, atomic_load_explicit(&prof_mean, memory_order_relaxed));
  mld_prof_lock();
  prof_stack_t *s = stack_intern(pcs, n);
  if (s) {
    live_t e = { (uintptr_t)p, s, w, size };
    s->alloc_objects += w;
    s->alloc_space += w * (double)size;
    if (live_insert(&e)) {
      s->inuse_objects += w;
      s->inuse_space += w * (double)size;
    }
    st_samples++;
    st_bytes += size;
  }
  mld_prof_unlock();
  mld_prof_dump_after_sample(w * (double)size);
  mld_self_alloc = was_busy;
}

static void unaccount(const live_t *e) {        /* lock held */
  e->st->inuse_objects -= e->w;
  e->st->inuse_space -= e->w * (double)e->size;
  if (e->st->inuse_objects < 1e-9) e->st->inuse_objects = e->st->inuse_space = 0;   /* no rounding residue */
}

void mld_prof_forget_slow(const void *p) {
  if (!atomic_load_explicit(&filter[filter_slot((uintptr_t)p)], memory_order_relaxed)) return;
  live_t e;
  mld_prof_lock();
  if (live_remove((uintptr_t)p, &e)) unaccount(&e);
  mld_prof_unlock();
}

bool mld_prof_detach(const void *p, prof_rec_t *out) {
  if (!atomic_load_explicit(&mld_prof_nlive, memory_order_relaxed) ||
      !atomic_load_explicit(&filter[filter_slot((uintptr_t)p)], memory_order_relaxed))
    return false;
  live_t e;
  mld_prof_lock();
  bool found = live_remove((uintptr_t)p, &e);
  uint64_t gen = reset_gen;
  mld_prof_unlock();
  if (!found) return false;
  *out = (prof_rec_t){ e.st, e.w, e.size, gen };
  MLD_RACE_WINDOW();   /* test builds: a reset may come while the record is out */
  return true;
}

void mld_prof_attach(const void *p, const prof_rec_t *rec) {
  live_t e = { (uintptr_t)p, rec->stack, rec->weight, rec->size };
  mld_prof_lock();
  /* A prof.reset while the block was out (during its mremap) zeroed the counts this record is part of and forgot
   * every live block: this one is forgotten too (put back, its later free would take its bytes off the counts of
   * blocks sampled after the reset). */
  if (rec->gen == reset_gen && !live_insert(&e)) unaccount(&e);   /* no room: the block is no longer followed */
  mld_prof_unlock();
}

/* ---- control ---- */
void mld_prof_stats(prof_stats_t *out) {
  memset(out, 0, sizeof *out);
  if (!mld_prof_opt.prof) return;
  mld_prof_lock();
  out->samples = st_samples;
  out->bytes_sampled = st_bytes;
  out->stacks = st_stacks;
  out->live = live_used;
  out->metadata = st_metadata;
  mld_prof_unlock();
  out->dumps = mld_prof_dumps();
}

static void ensure_boot(void) {
  mld_ensure_init();
  if (atomic_load(&boot_state) != 2) boot();
}

bool mld_prof_set_active(bool on) {
  if (!mld_prof_opt.prof) return false;
  ensure_boot();
  atomic_store(&prof_active, on);
  return true;
}

bool mld_prof_set_sample(size_t mean) {
  if (!mld_prof_opt.prof || mean == 0 || mean > ((size_t)1 << 40)) return false;
  ensure_boot();
  atomic_store(&prof_mean, mean);
  return true;
}

/* Forget every sample: counts go to zero and live blocks are no longer followed; stacks stay stored (dumps in
 * progress may be reading them), and are reused by later samples. */
bool mld_prof_reset(size_t mean) {
  if (!mld_prof_opt.prof || mean > ((size_t)1 << 40)) return false;
  ensure_boot();
  if (mean) atomic_store(&prof_mean, mean);
  int64_t now = (int64_t)mld_realtime_ns();
  mld_prof_lock();
  for (size_t i = 0; i < stack_cap; i++)
    for (prof_stack_t *s = stack_tab[i]; s; s = s->next)
      s->alloc_objects = s->alloc_space = s->inuse_objects = s->inuse_space = 0;
  for (size_t i = 0; i < live_cap; i++)
    if (live_tab[i].key > LIVE_TOMB) {
      atomic_fetch_sub_explicit(&filter[filter_slot(live_tab[i].key)], 1, memory_order_relaxed);
      live_tab[i].key = LIVE_TOMB;
    }
  atomic_store(&mld_prof_nlive, 0);
  live_tombs += live_used;
  live_used = 0;
  reset_gen++;
  st_samples = st_bytes = 0;
  prof_start_ns = now;
  mld_prof_unlock();
  return true;
}

size_t mld_prof_snapshot(prof_snap_t **out, size_t *bytes) {
  int64_t start;
  return mld_prof_snapshot_at(out, bytes, &start);
}

size_t mld_prof_snapshot_at(prof_snap_t **out, size_t *bytes, int64_t *start_ns) {
  *out = NULL;
  *bytes = 0;
  mld_prof_lock();
  *start_ns = prof_start_ns;   /* under the lock: a prof.reset writes it with the counts it zeroes */
  size_t n = 0;
  for (size_t i = 0; i < stack_cap; i++)
    for (prof_stack_t *s = stack_tab[i]; s; s = s->next) n += s->alloc_objects > 0 || s->inuse_objects > 0;
  size_t want = (n ? n : 1) * sizeof(prof_snap_t);
  want = mld_page_round(want);   /* n is bounded by the stacks in memory: no wrap */
  prof_snap_t *a = mld_os_map_plain(want, true);
  size_t k = 0;
  if (a) {
    for (size_t i = 0; i < stack_cap; i++)
      for (prof_stack_t *s = stack_tab[i]; s; s = s->next)
        if (s->alloc_objects > 0 || s->inuse_objects > 0)
          a[k++] = (prof_snap_t){ s, s->alloc_objects, s->alloc_space, s->inuse_objects, s->inuse_space };
    *out = a;
    *bytes = want;
  }
  mld_prof_unlock();
  return k;
}

size_t mld_prof_mean(void) {
  if (!mld_prof_opt.prof) return mld_prof_opt.sample;
  ensure_boot();
  return atomic_load(&prof_mean);
}
bool mld_prof_is_active(void) {
  if (!mld_prof_opt.prof) return false;
  ensure_boot();
  return atomic_load(&prof_active);
}
