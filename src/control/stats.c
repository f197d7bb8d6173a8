/* control/stats.c — statistics: per-heap counters summed when read, global figures, and the text/JSON report. */
#define _GNU_SOURCE
#include "core/core.h"
#include "mallard.h"
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "control/control.h"
#include "prof/prof.h"

/* A static link pulls live.o (the root a reader in another process looks for) from the archive with stats.o. */
__attribute__((used)) static const void *const keep_live_root = &mallard_live_root;

/* Sum the counters of live heaps and of exited threads. */
void mld_stats_sum(heap_stats_t *out) {
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&mld_heaps_mutex);
  mld_stats_add(out, &mld_dead_stats);
  mld_stats_add(out, &mld_orphan_stats);
  for (heap_t *h = mld_heaps_all; h; h = h->next_all) mld_stats_add(out, &h->stats);
  pthread_mutex_unlock(&mld_heaps_mutex);
}

static uint64_t sub0(uint64_t a, uint64_t b) { return a >= b ? a - b : 0; }   /* racy copies may not add up */

void mld_global_compute(global_stats_t *g, const heap_stats_t *hs, const arena_snapshot_t *arenas, unsigned narenas,
                        const stats_atomics_t *at) {
  memset(g, 0, sizeof *g);
  for (unsigned c = 0; c < MLD_NUM_CLASSES; c++) g->allocated += mld_class_curobjs(hs, c) * mld_class_size[c];
  uint64_t nseg = 0, dirty = 0, purged = 0, large = 0;
  for (unsigned i = 0; i < narenas; i++) {
    nseg += arenas[i].nsegments;
    dirty += arenas[i].dirty_bytes;
    purged += arenas[i].purged_bytes;
    large += arenas[i].large_active;
  }
  g->allocated += large + at->huge_active;
  g->active = sub0(nseg * at->segment_usable, dirty + purged) + at->huge_active;
  g->dirty = dirty + at->huge_cached;
  g->retained = purged;
  g->metadata = at->meta_bytes + nseg * at->huge_header + MLD_OWNER_MAP_TOUCHED_ESTIMATE;
  g->resident = g->active + g->dirty + g->metadata;
  /* The ownership map lives in .bss, outside our mappings: its touched page counts in metadata (so in resident)
   * and in mapped too, so that resident never exceeds mapped. */
  g->mapped = at->mapped_bytes + MLD_OWNER_MAP_TOUCHED_ESTIMATE;
  g->huge_cached = at->huge_cached;
}

static void local_atomics(stats_atomics_t *at) {
  at->huge_active = atomic_load(&mld_huge_active);
  at->huge_cached = atomic_load(&mld_huge_cached);
  at->meta_bytes = atomic_load(&mld_meta_bytes);
  at->mapped_bytes = atomic_load(&mld_mapped_bytes);
  at->segment_usable = MLD_USABLE_SLOTS * MLD_SLOT_SIZE;
  at->huge_header = mld_huge_header();
}

void mld_global_stats(global_stats_t *g) {
  heap_stats_t hs;
  mld_stats_sum(&hs);
  arena_snapshot_t tot = { 0 }, a;   /* the arenas summed: what the figures need of them */
  unsigned n = atomic_load(&mld_narenas);
  for (unsigned i = 0; i < n; i++) {
    if (!mld_arena_snapshot(i, &a)) continue;
    tot.nsegments += a.nsegments;
    tot.dirty_bytes += a.dirty_bytes;
    tot.purged_bytes += a.purged_bytes;
    tot.large_active += a.large_active;
  }
  stats_atomics_t at;
  local_atomics(&at);
  mld_global_compute(g, &hs, &tot, 1, &at);
}

/* This process's snapshot: heaps under the registry lock, each arena under its lock. */
/* The options the report shows, from this process's options (live.c reads another's through its root instead). */
void mld_snapshot_options(stats_snapshot_t *s, const options_t *o, const struct prof_options_s *po,
                          unsigned auto_arenas) {
  for (unsigned c = 0; c < MLD_NUM_CLASSES; c++)
    s->page_slots[c] = o->page_slots[c] <= MLD_MAX_PAGE_SLOTS ? o->page_slots[c] : 0;
  s->dirty_decay_ms = o->dirty_decay_ms;
  s->background_thread = o->background_thread;
  s->retain = o->retain;
  s->thp = o->thp;
  s->huge_cache_max = o->huge_cache_max;
  s->page_cache = o->page_cache;
  mld_options_format_of(o, po, auto_arenas, s->options_text, sizeof s->options_text);
}

static void local_snapshot(stats_snapshot_t *s) {
  snprintf(s->version, sizeof s->version, "%s", MALLARD_VERSION);
  mld_stats_sum(&s->hs);
  s->narenas = 0;
  unsigned n = atomic_load(&mld_narenas);
  for (unsigned i = 0; i < n && i < MLD_MAX_ARENAS; i++)
    if (mld_arena_snapshot(i, &s->arenas[s->narenas])) s->narenas++;
  stats_atomics_t at;
  local_atomics(&at);
  mld_global_compute(&s->g, &s->hs, s->arenas, s->narenas, &at);
  s->invalid_frees = atomic_load(&mld_invalid_count);
  mld_snapshot_options(s, &mld_opt, &mld_prof_opt, mld_auto_arenas);
  s->pid = (int)getpid();
  ssize_t xl = readlink("/proc/self/exe", s->exe, sizeof s->exe - 1);
  s->exe[xl > 0 ? xl : 0] = 0;
  s->uptime_ms = mld_now_ms() - mld_start_ms;
  s->ncpus = mld_ncpus();
  s->page_size = mld_os_page();
  s->purge_running = mld_purge_thread_running();
  s->purge_wakeups_known = true;
  s->purge_wakeups = mld_purge_thread_wakeups();
}

/* ---- report writer: formats into a stack buffer, never allocates ---- */
typedef struct out_s {
  void (*cb)(void *, const char *);
  void *opaque;
} out_t;

static void default_write(void *opaque, const char *s) {
  (void)opaque;
  size_t n = strlen(s);
  while (n) {
    ssize_t w = write(2, s, n);
    if (w <= 0) return;
    s += w;
    n -= (size_t)w;
  }
}

static void outf(out_t *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void outf(out_t *o, const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  o->cb(o->opaque, buf);
}

/* A string as JSON string content: quotes, backslashes and control bytes escaped (out holds 6 bytes per byte). */
static void json_escape(char *out, const char *s) {
  static const char hex[] = "0123456789abcdef";
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') { *out++ = '\\'; *out++ = (char)c; }
    else if (c < 0x20) { memcpy(out, "\\u00", 4); out[4] = hex[c >> 4]; out[5] = hex[c & 15]; out += 6; }
    else *out++ = (char)c;
  }
  *out = 0;
}

static void print_json(out_t *o, const stats_snapshot_t *s, bool arenas, bool classes) {
  char esc[sizeof s->exe * 6 + 1], wakeups[24] = "null";   /* null: a reader that cannot see the counter */
  json_escape(esc, s->exe);
  if (s->purge_wakeups_known) snprintf(wakeups, sizeof wakeups, "%llu", (unsigned long long)s->purge_wakeups);
  const global_stats_t *g = &s->g;
  const heap_stats_t *hs = &s->hs;
  outf(o, "{\"mallard\":{\"version\":\"%s\",\"pid\":%d,\"exe\":\"%s\",\n", s->version, s->pid, esc);
  outf(o, "\"options\":{\"narenas\":%u,\"dirty_decay_ms\":%ld,\"background_thread\":%s,\"retain\":%s,\"thp\":%d,"
          "\"huge_cache_max\":%zu,\"page_cache\":%u},\n", s->narenas, s->dirty_decay_ms,
       s->background_thread ? "true" : "false", s->retain ? "true" : "false", s->thp, s->huge_cache_max,
       s->page_cache);
  outf(o, "\"uptime_ms\":%llu,\"ncpus\":%zu,\"page_size\":%zu,\n", (unsigned long long)s->uptime_ms, s->ncpus,
       s->page_size);
  outf(o, "\"stats\":{\"allocated\":%llu,\"active\":%llu,\"resident\":%llu,\"mapped\":%llu,\"retained\":%llu,"
          "\"dirty\":%llu,\"metadata\":%llu,\"huge_cached\":%llu,\"invalid_frees\":%llu,\"remote_frees\":%llu,"
          "\"large\":{\"nmalloc\":%llu,\"nfree\":%llu},\"huge\":{\"nmalloc\":%llu,\"nfree\":%llu},"
          "\"background_thread\":{\"running\":%s,\"wakeups\":%s}},\n",
       (unsigned long long)g->allocated, (unsigned long long)g->active, (unsigned long long)g->resident,
       (unsigned long long)g->mapped, (unsigned long long)g->retained, (unsigned long long)g->dirty,
       (unsigned long long)g->metadata, (unsigned long long)g->huge_cached,
       (unsigned long long)s->invalid_frees, (unsigned long long)hs->remote_frees,
       (unsigned long long)hs->large_nmalloc, (unsigned long long)hs->large_nfree,
       (unsigned long long)hs->huge_nmalloc, (unsigned long long)hs->huge_nfree,
       s->purge_running ? "true" : "false", wakeups);
  outf(o, "\"arenas\":[");
  for (unsigned i = 0; arenas && i < s->narenas; i++) {
    const arena_snapshot_t *a = &s->arenas[i];
    outf(o, "%s\n{\"index\":%u,\"nthreads\":%u,\"nthreads_total\":%llu,\"segments\":%llu,\"dirty_bytes\":%llu,\"purged_bytes\":%llu,"
            "\"large_active\":%llu,\"npurge_passes\":%llu,\"nmadvise\":%llu,\"purged_total\":%llu,"
            "\"mutex\":{\"ops\":%llu,\"contended\":%llu,\"wait_ns\":%llu}}",
         i ? "," : "", i, a->nthreads, (unsigned long long)a->nthreads_total, (unsigned long long)a->nsegments, (unsigned long long)a->dirty_bytes,
         (unsigned long long)a->purged_bytes, (unsigned long long)a->large_active, (unsigned long long)a->npurge_passes,
         (unsigned long long)a->nmadvise, (unsigned long long)a->purged_total, (unsigned long long)a->lock.ops,
         (unsigned long long)a->lock.contended, (unsigned long long)a->lock.wait_ns);
  }
  outf(o, "],\n\"classes\":[");
  bool first = true;
  for (unsigned c = 0; classes && c < MLD_NUM_CLASSES; c++) {
    const class_stats_t *cs = &hs->cls[c];
    if (!hs->nmalloc[c] && !cs->npages) continue;
    size_t page_bytes = (size_t)s->page_slots[c] << MLD_SLOT_SHIFT;
    outf(o, "%s\n{\"class\":%u,\"size\":%u,\"page_bytes\":%zu,\"objs_per_page\":%zu,\"nmalloc\":%llu,\"nfree\":%llu,"
            "\"nrequests\":%llu,\"curobjs\":%llu,\"nrefills\":%llu,\"npages\":%llu,\"npages_cached\":%llu,"
            "\"npages_released\":%llu,\"curpages\":%llu}",
         first ? "" : ",", c, mld_class_size[c], page_bytes, page_bytes / mld_class_size[c],
         (unsigned long long)hs->nmalloc[c], (unsigned long long)cs->nfree, (unsigned long long)hs->nmalloc[c],
         (unsigned long long)mld_class_curobjs(hs, c),
         (unsigned long long)cs->nrefills, (unsigned long long)cs->npages, (unsigned long long)cs->npages_cached,
         (unsigned long long)cs->npages_released, (unsigned long long)mld_class_curpages(cs));
    first = false;
  }
  outf(o, "]}}\n");
}

static void print_text(out_t *o, const stats_snapshot_t *s, bool arenas, bool classes) {
  const global_stats_t *g = &s->g;
  const heap_stats_t *hs = &s->hs;
  outf(o, "___ Mallard statistics (version %s) ___\n", s->version);
  outf(o, "page size: %zu KiB\n", s->page_size / 1024);
  o->cb(o->opaque, "options: ");   /* longer than outf's buffer: written as it is */
  o->cb(o->opaque, s->options_text);
  o->cb(o->opaque, "\n");
  outf(o, "memory (bytes): allocated %llu  active %llu  resident %llu  mapped %llu  retained %llu  dirty %llu  "
          "metadata %llu\n",
       (unsigned long long)g->allocated, (unsigned long long)g->active, (unsigned long long)g->resident,
       (unsigned long long)g->mapped, (unsigned long long)g->retained, (unsigned long long)g->dirty,
       (unsigned long long)g->metadata);
  outf(o, "counts: large nmalloc %llu nfree %llu   huge nmalloc %llu nfree %llu   remote frees %llu   "
          "invalid frees %llu\n",
       (unsigned long long)hs->large_nmalloc, (unsigned long long)hs->large_nfree,
       (unsigned long long)hs->huge_nmalloc, (unsigned long long)hs->huge_nfree,
       (unsigned long long)hs->remote_frees, (unsigned long long)s->invalid_frees);
  unsigned n = arenas ? s->narenas : 0;
  if (n) outf(o, "arena threads segments   dirty_KiB  purged_KiB  purges madvise  lock_ops contended wait_us\n");
  for (unsigned i = 0; i < n; i++) {
    const arena_snapshot_t *a = &s->arenas[i];
    outf(o, "%5u %7u %8llu %11llu %11llu %7llu %7llu %9llu %9llu %7llu\n", i, a->nthreads,
         (unsigned long long)a->nsegments, (unsigned long long)a->dirty_bytes / 1024,
         (unsigned long long)a->purged_bytes / 1024, (unsigned long long)a->npurge_passes,
         (unsigned long long)a->nmadvise, (unsigned long long)a->lock.ops, (unsigned long long)a->lock.contended,
         (unsigned long long)a->lock.wait_ns / 1000);
  }
  if (classes) outf(o, "class size_B page_KiB objs/page     nmalloc       nfree     curobjs   refills  pages cur_pages\n");
  for (unsigned c = 0; classes && c < MLD_NUM_CLASSES; c++) {
    const class_stats_t *cs = &hs->cls[c];
    if (!hs->nmalloc[c] && !cs->npages) continue;
    size_t page_bytes = (size_t)s->page_slots[c] << MLD_SLOT_SHIFT;
    outf(o, "%5u %6u %8zu %9zu %11llu %11llu %11llu %9llu %6llu %9llu\n", c, mld_class_size[c], page_bytes / 1024,
         page_bytes / mld_class_size[c], (unsigned long long)hs->nmalloc[c], (unsigned long long)cs->nfree,
         (unsigned long long)mld_class_curobjs(hs, c), (unsigned long long)cs->nrefills,
         (unsigned long long)cs->npages, (unsigned long long)mld_class_curpages(cs));
  }
}

void mld_stats_print_snapshot(const stats_snapshot_t *s, void (*write_cb)(void *, const char *), void *opaque,
                              const char *opts) {
  out_t o = { write_cb ? write_cb : default_write, opaque };
  bool json = opts && strchr(opts, 'J'), arenas = !(opts && strchr(opts, 'a')), classes = !(opts && strchr(opts, 'b'));
  if (json) print_json(&o, s, arenas, classes);
  else print_text(&o, s, arenas, classes);
}

/* The snapshot (~12 KiB) is on the caller's stack: no lock, nothing allocated, safe in a fork child. */
MLD_EXPORT void mallard_stats_print(void (*write_cb)(void *, const char *), void *opaque, const char *opts) {
  mld_ensure_init();
  stats_snapshot_t snap;
  local_snapshot(&snap);
  mld_stats_print_snapshot(&snap, write_cb, opaque, opts);
}

/* The exit report goes to the stderr the program started with, and nowhere else.
 * Programs often close stderr in their own exit handlers (coreutils does), which run before ours: so a duplicate of
 * fd 2 is kept, close-on-exec, far above the descriptors programs use (bash's `exec 10>file` must not meet it), and
 * closed in a fork child (a daemon must not keep its parent's pipe open). At exit it is used only if it still is
 * our duplicate (close-on-exec still set, same device and inode as fd 2 at start-up); else fd 2 is used only if it
 * is still that file; else nothing is printed. fd 2 closed at start-up: nothing is ever printed. */
static int exit_fd = -1;
static bool exit_known;        /* fd 2 was open at start-up: exit_dev/exit_ino identify it */
static dev_t exit_dev;
static ino_t exit_ino;

static void exit_fd_fork_child(void) {
  if (exit_fd >= 0) close(exit_fd);
  exit_fd = -1;
}

void mld_stats_print_setup(void) {
  struct stat st;
  if (fstat(2, &st) != 0) return;
  exit_dev = st.st_dev;
  exit_ino = st.st_ino;
  exit_known = true;
  struct rlimit rl;
  long base = 1000;   /* near the usual 1024 limit; never above it, the table would grow with the limit */
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && (long)rl.rlim_cur - 24 < base)
    base = (long)rl.rlim_cur - 24;
  if (base < 64) base = 64;
  exit_fd = fcntl(2, F_DUPFD_CLOEXEC, (int)base);
  pthread_atfork(NULL, NULL, exit_fd_fork_child);
}

static bool is_start_stderr(int fd) {
  struct stat st;
  return fstat(fd, &st) == 0 && st.st_dev == exit_dev && st.st_ino == exit_ino;
}

static int exit_target(void) {
  if (!exit_known) return -1;
  if (exit_fd >= 0) {
    int fl = fcntl(exit_fd, F_GETFD);
    if (fl >= 0 && (fl & FD_CLOEXEC) && is_start_stderr(exit_fd)) return exit_fd;   /* dup2 onto it clears CLOEXEC */
  }
  return is_start_stderr(2) ? 2 : -1;
}

typedef struct exit_out_s {
  int fd;
  bool failed;   /* a write failed (a closed pipe...): stop writing */
} exit_out_t;

static void exit_write(void *opaque, const char *s) {
  exit_out_t *eo = opaque;
  size_t n = strlen(s);
  while (n && !eo->failed) {
    ssize_t w = write(eo->fd, s, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) { eo->failed = true; return; }
    s += w;
    n -= (size_t)w;
  }
}

/* SIGPIPE is blocked around the writes, and one they raised is consumed: a reader gone away must not kill the
 * program before stdio flushes its own output (that happens after the exit handlers). */
void mld_stats_print_at_exit(void) {
  exit_out_t eo = { exit_target(), false };
  if (eo.fd < 0) return;
  sigset_t pipe_set, old, pending;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  sigemptyset(&pending);
  sigpending(&pending);
  bool was_pending = sigismember(&pending, SIGPIPE);   /* already the program's (it blocked SIGPIPE): leave it */
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
  mallard_stats_print(exit_write, &eo, mld_opt.stats_print_opts);
  if (!was_pending) {
    sigemptyset(&pending);
    sigpending(&pending);
    if (sigismember(&pending, SIGPIPE)) {
      struct timespec zero = { 0, 0 };
      sigtimedwait(&pipe_set, NULL, &zero);
    }
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
}
