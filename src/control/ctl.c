/* control/ctl.c — mallard_ctl: a dotted namespace to read options and statistics and to steer arenas, threads and purging. */
#define _GNU_SOURCE
#include "core/core.h"
#include "mallard.h"
#include "control/control.h"
#include "core/secure.h"
#include "prof/prof.h"
#include "guarded/guarded.h"
#include <errno.h>
#include <stdlib.h>
#include <string.h>

static uint64_t ctl_epoch = 1;
static const char *thp_names[] = { "default", "madvise", "always" };
static const char *junk_names[] = { "false", "alloc", "free", "true" };   /* index: MLD_JUNK_* bits (junk.h) */

/* Copy a value out: the caller's buffer must be exactly the value's size. */
static int rd(void *oldp, size_t *oldlenp, const void *v, size_t n) {
  if (!oldp) return 0;
  if (!oldlenp || *oldlenp != n) return EINVAL;
  memcpy(oldp, v, n);
  return 0;
}
/* Would rd() accept this buffer? Checked before a write, so that a refused call changes nothing. */
static bool rd_ok(const void *oldp, const size_t *oldlenp, size_t n) { return !oldp || (oldlenp && *oldlenp == n); }
#define RO() do { if (newp || newlen) return EPERM; } while (0)
#define READ(T, expr) do { T v_ = (expr); return rd(oldp, oldlenp, &v_, sizeof v_); } while (0)

/* stats.<name>: counters of the heap statistics, summed over every heap (mld_stats_sum). */
static const struct { const char *name; size_t off; } heap_counters[] = {
  { "remote_frees", offsetof(heap_stats_t, remote_frees) },            /* frees into another thread's page */
  { "pages_handed_over", offsetof(heap_stats_t, pages_handed_over) },  /* idle threads' parked pages given away */
  { "pages_claimed", offsetof(heap_stats_t, pages_claimed) },          /* others' pages, every block freed remotely */
  { "pages_emptied", offsetof(heap_stats_t, pages_emptied) },          /* parked pages given back by their last remote free */
  { "pages_taken_idle", offsetof(heap_stats_t, pages_taken_idle) },    /* idle threads' pages, blocks still theirs */
  { "pages_parked", offsetof(heap_stats_t, pages_parked) },            /* pages parked by their owners' refills */
  { "frees_parked", offsetof(heap_stats_t, frees_parked) },            /* owners' locked frees into parked pages */
};

/* Parse "<digits>" at *s followed by '.' (or end); advances *s past it. */
static bool take_index(const char **s, unsigned *out) {
  char *end;
  if (**s < '0' || **s > '9') return false;
  unsigned long x = strtoul(*s, &end, 10);
  if (x > 1000000) return false;
  *out = (unsigned)x;
  *s = end;
  return true;
}

static uint64_t heap_bytes(const heap_stats_t *s, bool freed) {
  uint64_t b = 0;
  for (unsigned c = 0; c < MLD_NUM_CLASSES; c++) b += (freed ? s->cls[c].nfree : s->nmalloc[c]) * mld_class_size[c];
  return b + (freed ? s->large_bytes_free + s->huge_bytes_free : s->large_bytes_alloc + s->huge_bytes_alloc);
}

static int ctl_opt(const char *n, void *oldp, size_t *oldlenp, void *newp, size_t newlen) {
  RO();
  /* The option as resolved at start-up (0: one per CPU); arenas.create adds arenas, not to the option. */
  if (!strcmp(n, "narenas")) READ(unsigned, mld_opt.narenas ? mld_opt.narenas : mld_auto_arenas);
  if (!strcmp(n, "dirty_decay_ms")) READ(long, mld_opt.dirty_decay_ms);
  if (!strcmp(n, "dirty_decay_max_ms")) READ(long, mld_opt.dirty_decay_max_ms);
  if (!strcmp(n, "background_thread")) READ(bool, mld_opt.background_thread);
  if (!strcmp(n, "retain")) READ(bool, mld_opt.retain);
  if (!strcmp(n, "thp")) READ(const char *, mld_opt.thp < 0 ? "never" : thp_names[mld_opt.thp]);
  /* zero_on_free: what is in force (the fast variant refuses zero_on_free:true when parsing). */
  if (!strcmp(n, "verbose")) READ(bool, mld_opt.verbose);
  if (!strcmp(n, "abort_conf")) READ(bool, mld_opt.abort_conf);
  if (!strcmp(n, "stats_print")) READ(bool, mld_opt.stats_print);
  if (!strcmp(n, "stats_print_opts")) READ(const char *, mld_opt.stats_print_opts);
  if (!strcmp(n, "huge_cache_max")) READ(size_t, mld_opt.huge_cache_max);
  if (!strcmp(n, "page_cache")) READ(unsigned, mld_opt.page_cache);
  if (!strcmp(n, "zero_on_free")) READ(bool, mld_opt.zero_on_free);
  if (!strcmp(n, "tcache")) READ(bool, mld_opt.tcache);   /* the secure variant refuses tcache:true: false there */
  if (!strcmp(n, "secure")) READ(bool, MLD_SECURE_BUILD);
  /* The secure variant's defences as in force (the fast variant holds them off: 0, SIZE_MAX for none, false). */
  if (!strcmp(n, "guard_slab_interval")) READ(unsigned, mld_opt.guard_slab_interval);
  if (!strcmp(n, "secure_noaccess_min")) READ(size_t, mld_opt.secure_noaccess_min);
  if (!strcmp(n, "large_quarantine")) READ(unsigned, mld_opt.large_quarantine);
  if (!strcmp(n, "delayed_reuse")) READ(bool, mld_opt.delayed_reuse);
  if (!strcmp(n, "shuffle")) READ(unsigned, mld_opt.shuffle);
  if (!strcmp(n, "junk")) READ(const char *, junk_names[mld_opt.junk & 3]);
  if (!strcmp(n, "guard_sample")) READ(size_t, mld_opt.guard_sample);
  if (!strcmp(n, "guard_slots")) READ(unsigned, mld_opt.guard_slots);
  if (!strcmp(n, "guard_action")) READ(const char *, mld_opt.guard_action == MLD_GUARD_REPORT ? "report" : "abort");
  const prof_options_t *po = &mld_prof_opt;
  if (!strcmp(n, "prof")) READ(bool, po->prof);
  if (!strcmp(n, "prof_active")) READ(bool, po->active);
  if (!strcmp(n, "prof_sample")) READ(size_t, po->sample);
  if (!strcmp(n, "prof_final")) READ(bool, po->final);
  if (!strcmp(n, "prof_leak")) READ(bool, po->leak);
  if (!strcmp(n, "prof_prefix")) READ(const char *, po->prefix);
  if (!strcmp(n, "prof_interval")) READ(size_t, po->interval);
  if (!strcmp(n, "prof_signal")) READ(const char *, po->signame);
  unsigned c;
  if (!strncmp(n, "slab_sizes.", 11) && (n += 11, take_index(&n, &c)) && !*n && c < MLD_NUM_CLASSES)
    READ(size_t, (size_t)mld_opt.page_slots[c] << MLD_SLOT_SHIFT);
  return ENOENT;
}

static int ctl_stats(const char *n, void *oldp, size_t *oldlenp, void *newp, size_t newlen) {
  RO();
  global_stats_t g;
  if (!strncmp(n, "guard.", 6)) {   /* sampled guarded allocations (guarded.h) */
    guard_stats_t gs;
    mld_guard_stats(&gs);
    const char *s = n + 6;
    if (!strcmp(s, "samples")) READ(uint64_t, gs.samples);
    if (!strcmp(s, "live")) READ(uint64_t, gs.live);
    if (!strcmp(s, "skipped")) READ(uint64_t, gs.skipped);
    if (!strcmp(s, "reports")) READ(uint64_t, gs.reports);
    if (!strcmp(s, "slots")) READ(uint64_t, gs.slots);
    return ENOENT;
  }
  if (!strncmp(n, "arenas.", 7)) {
    const char *s = n + 7;
    unsigned i;
    arena_snapshot_t a;
    if (!take_index(&s, &i) || *s != '.' || !mld_arena_snapshot(i, &a)) return ENOENT;
    s++;
    if (!strcmp(s, "nthreads")) READ(unsigned, a.nthreads);
    if (!strcmp(s, "segments")) READ(uint64_t, a.nsegments);
    if (!strcmp(s, "dirty_bytes")) READ(uint64_t, a.dirty_bytes);
    if (!strcmp(s, "purged_bytes")) READ(uint64_t, a.purged_bytes);
    if (!strcmp(s, "large_active")) READ(uint64_t, a.large_active);
    if (!strcmp(s, "npurge_passes")) READ(uint64_t, a.npurge_passes);
    if (!strcmp(s, "nmadvise")) READ(uint64_t, a.nmadvise);
    if (!strcmp(s, "mutex.ops")) READ(uint64_t, a.lock.ops);
    if (!strcmp(s, "mutex.contended")) READ(uint64_t, a.lock.contended);
    if (!strcmp(s, "mutex.wait_ns")) READ(uint64_t, a.lock.wait_ns);
    return ENOENT;
  }
  if (!strncmp(n, "classes.", 8)) {
    const char *s = n + 8;
    unsigned c;
    if (!take_index(&s, &c) || *s != '.' || c >= MLD_NUM_CLASSES) return ENOENT;
    s++;
    heap_stats_t hs;
    mld_stats_sum(&hs);
    const class_stats_t *cs = &hs.cls[c];
    if (!strcmp(s, "size")) READ(size_t, mld_class_size[c]);
    if (!strcmp(s, "objs_per_page")) READ(size_t, ((size_t)mld_opt.page_slots[c] << MLD_SLOT_SHIFT) / mld_class_size[c]);
    if (!strcmp(s, "nmalloc") || !strcmp(s, "nrequests")) READ(uint64_t, hs.nmalloc[c]);
    if (!strcmp(s, "nfree")) READ(uint64_t, cs->nfree);
    if (!strcmp(s, "curobjs")) READ(uint64_t, mld_class_curobjs(&hs, c));
    if (!strcmp(s, "nrefills")) READ(uint64_t, cs->nrefills);
    if (!strcmp(s, "npages")) READ(uint64_t, cs->npages);
    if (!strcmp(s, "curpages")) READ(uint64_t, mld_class_curpages(cs));
    return ENOENT;
  }
  /* The decay in force: dirty_decay_ms, or longer while purged memory is faulted in again (arena.c). */
  if (!strcmp(n, "dirty_decay_ms")) READ(long, mld_decay_current(mld_now_ms()));
  for (size_t i = 0; i < sizeof heap_counters / sizeof heap_counters[0]; i++) {
    if (strcmp(n, heap_counters[i].name)) continue;
    heap_stats_t hs;
    mld_stats_sum(&hs);
    READ(uint64_t, *(const uint64_t *)((const uint8_t *)&hs + heap_counters[i].off));
  }
  mld_global_stats(&g);
  if (!strcmp(n, "allocated")) READ(size_t, g.allocated);
  if (!strcmp(n, "active")) READ(size_t, g.active);
  if (!strcmp(n, "resident")) READ(size_t, g.resident);
  if (!strcmp(n, "mapped")) READ(size_t, g.mapped);
  if (!strcmp(n, "retained")) READ(size_t, g.retained);
  if (!strcmp(n, "dirty")) READ(size_t, g.dirty);
  if (!strcmp(n, "metadata")) READ(size_t, g.metadata);
  return ENOENT;
}

/* Heap profiling (prof.h). Writes need prof:true at start-up (EPERM otherwise: the profiler cannot be added later). */
static int ctl_prof(const char *n, void *oldp, size_t *oldlenp, void *newp, size_t newlen) {
  if (!strcmp(n, "active")) {
    if (newp) {
      if (newlen != sizeof(bool) || !rd_ok(oldp, oldlenp, sizeof(bool))) return EINVAL;
      if (!mld_prof_opt.prof) return EPERM;
      bool old = mld_prof_is_active(), on;
      memcpy(&on, newp, sizeof on);
      mld_prof_set_active(on);
      READ(bool, old);
    }
    READ(bool, mld_prof_is_active());
  }
  if (!strcmp(n, "sample")) {
    if (newp) {
      if (newlen != sizeof(size_t) || !rd_ok(oldp, oldlenp, sizeof(size_t))) return EINVAL;
      if (!mld_prof_opt.prof) return EPERM;
      size_t old = mld_prof_mean(), mean;
      memcpy(&mean, newp, sizeof mean);
      if (!mld_prof_set_sample(mean)) return EINVAL;
      READ(size_t, old);
    }
    READ(size_t, mld_prof_mean());
  }
  if (!strcmp(n, "dump")) {   /* write: const char * (a path, or NULL for PREFIX.PID.SEQ.pb.gz) */
    if (oldp || !newp || newlen != sizeof(const char *)) return EINVAL;
    if (!mld_prof_opt.prof) return EPERM;
    const char *path;
    memcpy(&path, newp, sizeof path);
    return mld_prof_dump(path) ? EFAULT : 0;
  }
  if (!strcmp(n, "reset")) {   /* write: size_t, a new mean (0: keep), or call with all NULL */
    if (oldp) return EINVAL;
    size_t mean = 0;
    if (newp) {
      if (newlen != sizeof(size_t)) return EINVAL;
      memcpy(&mean, newp, sizeof mean);
    }
    if (!mld_prof_opt.prof) return EPERM;
    return mld_prof_reset(mean) ? 0 : EINVAL;
  }
  if (!strncmp(n, "stats.", 6)) {
    RO();
    prof_stats_t st;
    mld_prof_stats(&st);
    n += 6;
    if (!strcmp(n, "samples")) READ(uint64_t, st.samples);
    if (!strcmp(n, "bytes_sampled")) READ(uint64_t, st.bytes_sampled);
    if (!strcmp(n, "stacks")) READ(uint64_t, st.stacks);
    if (!strcmp(n, "live")) READ(uint64_t, st.live);
    if (!strcmp(n, "metadata")) READ(uint64_t, st.metadata);
    if (!strcmp(n, "dumps")) READ(uint64_t, st.dumps);
  }
  return ENOENT;
}

MLD_EXPORT int mallard_ctl(const char *name, void *oldp, size_t *oldlenp, void *newp, size_t newlen) {
  if (!name) return EINVAL;
  if (!newp && newlen) return EINVAL;   /* a length without a value: a caller's mistake, not a read */
  if (oldp && !oldlenp) return EINVAL;
  mld_ensure_init();
  if (!strcmp(name, "version")) { RO(); READ(const char *, MALLARD_VERSION); }
  if (!strcmp(name, "epoch")) {
    if (newp) {
      if (newlen != sizeof(uint64_t) || !rd_ok(oldp, oldlenp, sizeof(uint64_t))) return EINVAL;
      ctl_epoch++;   /* statistics are always live: the epoch only tells readers that they looked again */
    }
    READ(uint64_t, ctl_epoch);
  }
  if (!strncmp(name, "opt.", 4)) return ctl_opt(name + 4, oldp, oldlenp, newp, newlen);
  if (!strncmp(name, "stats.", 6)) return ctl_stats(name + 6, oldp, oldlenp, newp, newlen);
  if (!strcmp(name, "arenas.narenas")) { RO(); READ(unsigned, atomic_load(&mld_narenas)); }
  if (!strcmp(name, "arenas.create")) {
    RO();
    if (!oldp) return EINVAL;
    if (!oldlenp || *oldlenp != sizeof(unsigned)) return EINVAL;
    int i = mld_arena_create();
    if (i < 0) return EAGAIN;
    READ(unsigned, (unsigned)i);
  }
  if (!strcmp(name, "arenas.nclasses")) { RO(); READ(unsigned, MLD_NUM_CLASSES); }
  if (!strncmp(name, "thread.", 7)) {
    heap_t *h = mld_heap_get();
    if (!h) return EAGAIN;
    const char *s = name + 7;
    if (!strcmp(s, "arena")) {
      unsigned old = h->arena->index;
      if (newp) {
        if (newlen != sizeof(unsigned) || !rd_ok(oldp, oldlenp, sizeof(unsigned))) return EINVAL;
        unsigned want;
        memcpy(&want, newp, sizeof want);
        if (!mld_heap_bind_arena(h, want)) return EINVAL;
      }
      READ(unsigned, old);
    }
    if (!strcmp(s, "allocated")) { RO(); READ(uint64_t, heap_bytes(&h->stats, false)); }
    if (!strcmp(s, "deallocated")) { RO(); READ(uint64_t, heap_bytes(&h->stats, true)); }
    if (!strcmp(s, "tcache.flush")) {
      if (oldp || newp) return EINVAL;
      mld_heap_collect(h, true);
      return 0;
    }
    return ENOENT;
  }
  if (!strncmp(name, "arena.", 6)) {
    const char *s = name + 6;
    unsigned i;
    if (!take_index(&s, &i) || *s != '.') return ENOENT;
    arena_t *a = mld_arena_get(i);
    if (!a) return ENOENT;
    s++;
    bool all = !strcmp(s, "purge");
    if (!all && strcmp(s, "decay")) return ENOENT;
    if (oldp || newp) return EINVAL;
    mld_lock(&a->lock, &a->lock_stats);
    if (all) mld_arena_purge(a, true); else mld_arena_maybe_purge(a, mld_now_ms());
    pthread_mutex_unlock(&a->lock);
    return 0;
  }
  if (!strcmp(name, "background_thread")) { RO(); READ(bool, mld_purge_thread_running()); }
  if (!strncmp(name, "prof.", 5)) return ctl_prof(name + 5, oldp, oldlenp, newp, newlen);
  return ENOENT;
}
