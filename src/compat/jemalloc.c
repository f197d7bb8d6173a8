/* compat/jemalloc.c — jemalloc's introspection API (mallctl, mallctlnametomib, mallctlbymib, malloc_stats_print) answered by Mallard: jemalloc's names mapped onto mallard_ctl's. */
#define _GNU_SOURCE
#include "core/core.h"
#include "mallard.h"
#include "control/control.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

/* Only the replacing libraries (MALLARD_OVERRIDE) define jemalloc's names: libmallard-prefix.a must not. */
#ifdef MALLARD_OVERRIDE
#define JE_EXPORT __attribute__((visibility("default")))
#define JE_ARENAS_ALL 4096u   /* jemalloc's MALLCTL_ARENAS_ALL */
#define JE_MIB_MAX 8          /* the most components a name has ("stats.arenas.<i>.bins.<j>.curregs" has 6) */
#define JE_NAME_MAX 128       /* longest name rebuilt from a MIB */

/* thread.allocatedp / thread.deallocatedp point at these: this thread's byte counters as of its last mallctl call
 * (kept only once a thread asked for the pointers; the fast paths never touch them). Valid for the thread's life. */
static __thread uint64_t tl_allocated, tl_deallocated;
static __thread bool tl_pointers_given;

static int rd(void *oldp, size_t *oldlenp, const void *v, size_t n) {
  if (!oldp) return 0;
  if (!oldlenp || *oldlenp != n) return EINVAL;   /* jemalloc: a buffer of the wrong size is EINVAL */
  memcpy(oldp, v, n);
  return 0;
}
#define RO() do { if (newp || newlen) return EPERM; } while (0)
#define READ(T, expr) do { T v_ = (expr); return rd(oldp, oldlenp, &v_, sizeof v_); } while (0)

/* "<digits>" at *s, at most 7 digits (an index, never a size); advances *s past it. */
static bool take_index(const char **s, unsigned *out) {
  unsigned x = 0, nd = 0;
  const char *p = *s;
  while (*p >= '0' && *p <= '9') {
    if (++nd > 7) return false;
    x = x * 10 + (unsigned)(*p++ - '0');
  }
  if (!nd) return false;
  *out = x;
  *s = p;
  return true;
}

/* This thread's bytes allocated / freed (block sizes), from its heap's statistics counters. */
static void thread_bytes(heap_t *h, uint64_t *alloc, uint64_t *freed) {
  uint64_t a = h->stats.large_bytes_alloc + h->stats.huge_bytes_alloc;
  uint64_t f = h->stats.large_bytes_free + h->stats.huge_bytes_free;
  for (unsigned c = 0; c < MLD_NUM_CLASSES; c++) {
    a += h->stats.nmalloc[c] * mld_class_size[c];
    f += h->stats.cls[c].nfree * mld_class_size[c];
  }
  *alloc = a;
  *freed = f;
}

static void refresh_thread_pointers(void) {
  if (!tl_pointers_given) return;
  heap_t *h = mld_heap_get();
  if (h) thread_bytes(h, &tl_allocated, &tl_deallocated);
}

/* Is i "every arena"? MALLCTL_ARENAS_ALL, or the index one past the last arena (jemalloc 4's convention, still
 * used by Redis's MEMORY PURGE: "arena.<narenas>.purge"). */
static bool all_arenas(unsigned i) { return i == JE_ARENAS_ALL || i == atomic_load(&mld_narenas); }

/* stats.arenas.<all>.*: the merged figures Redis reads (zmalloc_get_allocator_info, the small-bin fragmentation). */
static int stats_all(const char *s, void *oldp, size_t *oldlenp) {
  global_stats_t g;
  mld_global_stats(&g);
  if (!strcmp(s, "pactive")) READ(size_t, (size_t)(g.active / mld_os_page()));
  if (!strcmp(s, "pdirty")) READ(size_t, (size_t)(g.dirty / mld_os_page()));
  if (!strcmp(s, "pmuzzy")) READ(size_t, 0);   /* Mallard purges in one step: no muzzy pages */
  if (!strcmp(s, "mapped")) READ(size_t, (size_t)g.mapped);
  if (!strcmp(s, "retained")) READ(size_t, (size_t)g.retained);
  if (!strcmp(s, "resident")) READ(size_t, (size_t)g.resident);
  if (!strcmp(s, "nthreads")) {
    unsigned n = 0, na = atomic_load(&mld_narenas);
    for (unsigned i = 0; i < na; i++) {
      arena_snapshot_t a;
      if (mld_arena_snapshot(i, &a)) n += a.nthreads;
    }
    READ(unsigned, n);
  }
  heap_stats_t hs;
  mld_stats_sum(&hs);
  uint64_t small = 0;
  for (unsigned c = 0; c < MLD_NUM_CLASSES; c++)
    small += mld_class_curobjs(&hs, c) * mld_class_size[c];
  if (!strcmp(s, "small.allocated")) READ(size_t, (size_t)small);
  /* large: jemalloc's name for everything above the small classes (Mallard's large and huge blocks). */
  if (!strcmp(s, "large.allocated")) READ(size_t, (size_t)(g.allocated > small ? g.allocated - small : 0));
  unsigned c;
  if (!strncmp(s, "bins.", 5) && (s += 5, take_index(&s, &c)) && *s == '.' && c < MLD_NUM_CLASSES) {
    const class_stats_t *cs = &hs.cls[c];
    s++;
    if (!strcmp(s, "curregs")) READ(size_t, (size_t)mld_class_curobjs(&hs, c));
    if (!strcmp(s, "curslabs")) READ(size_t, (size_t)mld_class_curpages(cs));
    if (!strcmp(s, "nmalloc")) READ(uint64_t, hs.nmalloc[c]);
    if (!strcmp(s, "ndalloc")) READ(uint64_t, cs->nfree);
    if (!strcmp(s, "nrequests")) READ(uint64_t, hs.nmalloc[c]);
  }
  return ENOENT;
}

static int je_mallctl(const char *name, void *oldp, size_t *oldlenp, void *newp, size_t newlen) {
  if (!name) return EINVAL;
  if (!newp && newlen) return EINVAL;
  if (oldp && !oldlenp) return EINVAL;
  mld_ensure_init();
  refresh_thread_pointers();
  if (!strcmp(name, "thread.allocatedp") || !strcmp(name, "thread.deallocatedp")) {
    RO();
    if (!tl_pointers_given) {
      tl_pointers_given = true;
      refresh_thread_pointers();
    }
    READ(uint64_t *, name[7] == 'a' ? &tl_allocated : &tl_deallocated);   /* "thread.allocatedp"[7] == 'a' */
  }
  if (!strcmp(name, "opt.dirty_decay_ms")) { RO(); READ(ssize_t, (ssize_t)mld_opt.dirty_decay_ms); }
  if (!strcmp(name, "background_thread") && newp) {
    /* Writable in jemalloc (Redis writes true at start-up). Mallard's purging thread follows its option: asking
     * for what the option already says succeeds, asking for the opposite is refused. */
    bool want;
    if (newlen != sizeof want) return EINVAL;
    if (oldp && *oldlenp != sizeof(bool)) return EINVAL;
    memcpy(&want, newp, sizeof want);
    if (want != mld_opt.background_thread) return EPERM;
    return mallard_ctl(name, oldp, oldlenp, NULL, 0);
  }
  if (!strcmp(name, "arenas.page")) { RO(); READ(size_t, (size_t)mld_os_page()); }
  if (!strcmp(name, "arenas.quantum")) { RO(); READ(size_t, (size_t)MLD_MIN_ALIGN); }
  if (!strcmp(name, "arenas.nbins")) { RO(); READ(unsigned, MLD_NUM_CLASSES); }
  unsigned i, c;
  const char *s;
  if (!strncmp(name, "arenas.bin.", 11)) {
    s = name + 11;
    if (!take_index(&s, &c) || *s != '.' || c >= MLD_NUM_CLASSES) return ENOENT;
    s++;
    RO();
    size_t page = (size_t)mld_opt.page_slots[c] << MLD_SLOT_SHIFT;
    if (!strcmp(s, "size")) READ(size_t, (size_t)mld_class_size[c]);
    if (!strcmp(s, "nregs")) READ(uint32_t, (uint32_t)(page / mld_class_size[c]));
    if (!strcmp(s, "slab_size")) READ(size_t, page);
    return ENOENT;
  }
  if (!strncmp(name, "arena.", 6)) {
    s = name + 6;
    if (!take_index(&s, &i) || *s != '.') return ENOENT;
    if (all_arenas(i) && (!strcmp(s, ".purge") || !strcmp(s, ".decay"))) {
      if (oldp || newp) return EINVAL;
      mld_collect(s[1] == 'p');   /* purge: everything now; decay: what its delay has released */
      return 0;
    }
    return mallard_ctl(name, oldp, oldlenp, newp, newlen);   /* one arena: mallard_ctl's arena.<i>.* */
  }
  if (!strncmp(name, "stats.arenas.", 13)) {
    s = name + 13;
    if (!take_index(&s, &i) || *s != '.') return ENOENT;
    RO();
    if (all_arenas(i)) return stats_all(s + 1, oldp, oldlenp);
    s++;
    if (!strcmp(s, "pmuzzy")) {
      if (!mld_arena_get(i)) return ENOENT;
      READ(size_t, 0);
    }
    if (!strcmp(s, "pdirty") || !strcmp(s, "pactive")) {
      arena_snapshot_t a;
      if (!mld_arena_snapshot(i, &a)) return ENOENT;
      uint64_t span = a.nsegments * MLD_USABLE_SLOTS * (uint64_t)MLD_SLOT_SIZE, idle = a.dirty_bytes + a.purged_bytes;
      if (s[1] == 'd') READ(size_t, (size_t)(a.dirty_bytes / mld_os_page()));
      READ(size_t, (size_t)((span > idle ? span - idle : 0) / mld_os_page()));
    }
    return mallard_ctl(name, oldp, oldlenp, NULL, 0);   /* Mallard's own per-arena fields (nthreads, ...) */
  }
  if (!strcmp(name, "prof.reset")) {   /* jemalloc's value is lg_prof_sample (size_t); Mallard's the mean itself */
    if (oldp || (newp && newlen != sizeof(size_t))) return EINVAL;
    size_t lg = 0, mean = 0;
    if (newp) {
      memcpy(&lg, newp, sizeof lg);
      if (lg > 40) return EINVAL;
      mean = (size_t)1 << lg;
    }
    return mallard_ctl("prof.reset", NULL, NULL, newp ? &mean : NULL, newp ? sizeof mean : 0);
  }
  if (!strcmp(name, "prof.lg_sample") || !strcmp(name, "opt.lg_prof_sample")) {   /* log2 of Mallard's mean */
    if (newp || newlen) return EPERM;
    size_t m = 0, l = sizeof m;
    int e = mallard_ctl(name[0] == 'o' ? "opt.prof_sample" : "prof.sample", &m, &l, NULL, 0);
    if (e) return e;
    size_t lg = m ? 63 - (size_t)__builtin_clzl(m) : 0;
    return rd(oldp, oldlenp, &lg, sizeof lg);
  }
  /* Everything else means the same in both: version, epoch, stats.*, opt.narenas, opt.background_thread,
   * arenas.narenas, arenas.create, thread.arena, thread.allocated, thread.deallocated, thread.tcache.flush,
   * background_thread (read), prof.active, prof.dump, opt.prof*; and Mallard's own names. An unknown name is ENOENT there. */
  return mallard_ctl(name, oldp, oldlenp, newp, newlen);
}

/* ---- MIBs: a name's components, each one an index (numbers) or JE_MIB_WORD + its place in `words` ---- */
#define JE_MIB_WORD ((size_t)1 << 62)   /* above any index take_index accepts: the two kinds never meet */
static const char *const words[] = {
  "version", "epoch", "background_thread", "opt", "narenas", "dirty_decay_ms", "retain", "thp", "verbose",
  "abort_conf", "stats_print", "stats_print_opts", "huge_cache_max", "page_cache", "zero_on_free", "secure",
  "slab_sizes", "stats", "allocated", "active", "resident", "mapped", "retained", "dirty", "metadata", "arenas",
  "create", "nclasses", "page", "quantum", "nbins", "bin", "size", "nregs", "slab_size", "arena", "purge", "decay",
  "thread", "deallocated", "allocatedp", "deallocatedp", "tcache", "flush", "nthreads", "segments", "dirty_bytes",
  "purged_bytes", "large_active", "npurge_passes", "nmadvise", "mutex", "ops", "contended", "wait_ns", "classes",
  "objs_per_page", "nmalloc", "nrequests", "nfree", "curobjs", "nrefills", "npages", "curpages", "pactive",
  "pdirty", "pmuzzy", "small", "large", "bins", "curregs", "curslabs", "ndalloc",
};
#define NWORDS (sizeof words / sizeof words[0])

static int je_nametomib(const char *name, size_t *mibp, size_t *miblenp) {
  if (!name || !mibp || !miblenp) return EINVAL;
  size_t n = 0, cap = *miblenp > JE_MIB_MAX ? JE_MIB_MAX : *miblenp;
  size_t tmp[JE_MIB_MAX];
  const char *p = name;
  for (;;) {
    const char *dot = strchr(p, '.');
    size_t len = dot ? (size_t)(dot - p) : strlen(p);
    if (n == cap) return ENOENT;   /* more components than the caller's array holds */
    unsigned idx;
    const char *q = p;
    if (take_index(&q, &idx) && q == p + len) {
      tmp[n++] = idx;
    } else {
      size_t w = 0;
      while (w < NWORDS && (strlen(words[w]) != len || memcmp(words[w], p, len))) w++;
      if (w == NWORDS) return ENOENT;   /* no name has this component */
      tmp[n++] = JE_MIB_WORD + w;
    }
    if (!dot) break;
    p = dot + 1;
  }
  memcpy(mibp, tmp, n * sizeof *tmp);
  *miblenp = n;
  return 0;
}

/* The name a MIB stands for, or false (unknown component, too long). */
static bool mib_name(const size_t *mib, size_t miblen, char *buf, size_t len) {
  if (!mib || miblen == 0 || miblen > JE_MIB_MAX) return false;
  size_t off = 0;
  for (size_t k = 0; k < miblen; k++) {
    int r;
    if (mib[k] >= JE_MIB_WORD) {
      if (mib[k] - JE_MIB_WORD >= NWORDS) return false;
      r = snprintf(buf + off, len - off, "%s%s", k ? "." : "", words[mib[k] - JE_MIB_WORD]);
    } else {
      if (mib[k] > 9999999) return false;   /* an index take_index would refuse */
      r = snprintf(buf + off, len - off, "%s%zu", k ? "." : "", mib[k]);
    }
    if (r < 0 || (size_t)r >= len - off) return false;
    off += (size_t)r;
  }
  return true;
}

JE_EXPORT int mallctl(const char *name, void *oldp, size_t *oldlenp, void *newp, size_t newlen) {
  return je_mallctl(name, oldp, oldlenp, newp, newlen);
}

JE_EXPORT int mallctlnametomib(const char *name, size_t *mibp, size_t *miblenp) {
  return je_nametomib(name, mibp, miblenp);
}

JE_EXPORT int mallctlbymib(const size_t *mib, size_t miblen, void *oldp, size_t *oldlenp, void *newp, size_t newlen) {
  char name[JE_NAME_MAX];
  if (!mib_name(mib, miblen, name, sizeof name)) return ENOENT;
  return je_mallctl(name, oldp, oldlenp, newp, newlen);
}

/* jemalloc's opts letters that Mallard's report shares: J (JSON), a (no per-arena), b (no per-class/bin); the
 * others (g, m, d, l, x, e, h) select sections Mallard does not have and are ignored. */
JE_EXPORT void malloc_stats_print(void (*write_cb)(void *, const char *), void *cbopaque, const char *opts) {
  char mine[4];
  size_t n = 0;
  for (const char *p = opts; p && *p && n < sizeof mine - 1; p++)
    if ((*p == 'J' || *p == 'a' || *p == 'b') && !memchr(mine, *p, n)) mine[n++] = *p;
  mine[n] = 0;
  mallard_stats_print(write_cb, cbopaque, mine);
}
#endif
