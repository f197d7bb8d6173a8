/* stats.c — statistics: per-heap counters summed when read, global figures, and the text/JSON report. */
#define _GNU_SOURCE
#include "internal.h"
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
#include "stats.h"

/* Sum the counters of live heaps and of exited threads. */
void mld_stats_sum(heap_stats_t *out) {
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&mld_heaps_mutex);
  mld_stats_add(out, &mld_dead_stats);
  mld_stats_add(out, &mld_orphan_stats);
  for (heap_t *h = mld_heaps_all; h; h = h->next_all) mld_stats_add(out, &h->stats);
  pthread_mutex_unlock(&mld_heaps_mutex);
}

void mld_global_stats(global_stats_t *g) {
  memset(g, 0, sizeof *g);
  heap_stats_t hs;
  mld_stats_sum(&hs);
  for (unsigned c = 0; c < MLD_NUM_CLASSES; c++) {
    uint64_t live = hs.cls[c].nmalloc >= hs.cls[c].nfree ? hs.cls[c].nmalloc - hs.cls[c].nfree : 0;
    g->allocated += live * mld_class_size[c];
  }
  size_t nseg = 0, dirty = 0, purged = 0, large = 0;
  unsigned n = atomic_load(&mld_narenas);
  for (unsigned i = 0; i < n; i++) {
    arena_t *a = mld_arenas[i];
    mld_lock(&a->lock, &a->lock_stats);
    nseg += a->nsegments;
    dirty += a->dirty_slots;
    purged += a->purged_slots;
    large += a->large_active;
    pthread_mutex_unlock(&a->lock);
  }
  uint64_t huge = atomic_load(&mld_huge_active), cached = atomic_load(&mld_huge_cached);
  g->allocated += large + huge;
  g->active = ((uint64_t)nseg * MLD_USABLE_SLOTS - dirty - purged) * MLD_SLOT_SIZE + huge;
  g->dirty = (uint64_t)dirty * MLD_SLOT_SIZE + cached;
  g->retained = (uint64_t)purged * MLD_SLOT_SIZE;
  g->metadata = atomic_load(&mld_meta_bytes) + (uint64_t)nseg * MLD_HUGE_HEADER + MLD_OWNER_MAP_TOUCHED_ESTIMATE;
  g->resident = g->active + g->dirty + g->metadata;
  /* The ownership map lives in .bss, outside our mappings: its touched page counts in metadata (so in resident)
   * and in mapped too, so that resident never exceeds mapped. */
  g->mapped = atomic_load(&mld_mapped_bytes) + MLD_OWNER_MAP_TOUCHED_ESTIMATE;
  g->huge_cached = cached;
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

static void print_json(out_t *o, const global_stats_t *g, const heap_stats_t *hs, bool arenas, bool classes) {
  char exe[512], esc[sizeof exe * 6 + 1];
  ssize_t xl = readlink("/proc/self/exe", exe, sizeof exe - 1);
  exe[xl > 0 ? xl : 0] = 0;
  json_escape(esc, exe);
  outf(o, "{\"mallard\":{\"version\":\"%s\",\"pid\":%d,\"exe\":\"%s\",\n", MALLARD_VERSION, (int)getpid(), esc);
  outf(o, "\"options\":{\"narenas\":%u,\"dirty_decay_ms\":%ld,\"background_thread\":%s,\"retain\":%s,\"thp\":%d,"
          "\"huge_cache_max\":%zu,\"page_cache\":%u},\n", atomic_load(&mld_narenas), mld_opt.dirty_decay_ms,
       mld_opt.background_thread ? "true" : "false", mld_opt.retain ? "true" : "false", mld_opt.thp,
       mld_opt.huge_cache_max, mld_opt.page_cache);
  outf(o, "\"uptime_ms\":%llu,\"ncpus\":%zu,\n", (unsigned long long)(mld_now_ms() - mld_start_ms), mld_ncpus());
  outf(o, "\"stats\":{\"allocated\":%llu,\"active\":%llu,\"resident\":%llu,\"mapped\":%llu,\"retained\":%llu,"
          "\"dirty\":%llu,\"metadata\":%llu,\"huge_cached\":%llu,\"invalid_frees\":%llu,\"remote_frees\":%llu,"
          "\"large\":{\"nmalloc\":%llu,\"nfree\":%llu},\"huge\":{\"nmalloc\":%llu,\"nfree\":%llu},"
          "\"background_thread\":{\"running\":%s,\"wakeups\":%llu}},\n",
       (unsigned long long)g->allocated, (unsigned long long)g->active, (unsigned long long)g->resident,
       (unsigned long long)g->mapped, (unsigned long long)g->retained, (unsigned long long)g->dirty,
       (unsigned long long)g->metadata, (unsigned long long)g->huge_cached,
       (unsigned long long)atomic_load(&mld_invalid_count), (unsigned long long)hs->remote_frees,
       (unsigned long long)hs->large_nmalloc, (unsigned long long)hs->large_nfree,
       (unsigned long long)hs->huge_nmalloc, (unsigned long long)hs->huge_nfree,
       mld_purge_thread_running() ? "true" : "false", (unsigned long long)mld_purge_thread_wakeups());
  outf(o, "\"arenas\":[");
  unsigned n = arenas ? atomic_load(&mld_narenas) : 0;
  for (unsigned i = 0; i < n; i++) {
    arena_snapshot_t s;
    mld_arena_snapshot(i, &s);
    outf(o, "%s\n{\"index\":%u,\"nthreads\":%u,\"nthreads_total\":%llu,\"segments\":%llu,\"dirty_bytes\":%llu,\"purged_bytes\":%llu,"
            "\"large_active\":%llu,\"npurge_passes\":%llu,\"nmadvise\":%llu,\"purged_total\":%llu,"
            "\"mutex\":{\"ops\":%llu,\"contended\":%llu,\"wait_ns\":%llu}}",
         i ? "," : "", i, s.nthreads, (unsigned long long)s.nthreads_total, (unsigned long long)s.nsegments, (unsigned long long)s.dirty_bytes,
         (unsigned long long)s.purged_bytes, (unsigned long long)s.large_active, (unsigned long long)s.npurge_passes,
         (unsigned long long)s.nmadvise, (unsigned long long)s.purged_total, (unsigned long long)s.lock.ops,
         (unsigned long long)s.lock.contended, (unsigned long long)s.lock.wait_ns);
  }
  outf(o, "],\n\"classes\":[");
  bool first = true;
  for (unsigned c = 0; classes && c < MLD_NUM_CLASSES; c++) {
    const class_stats_t *cs = &hs->cls[c];
    if (!cs->nmalloc && !cs->npages) continue;
    size_t page_bytes = (size_t)mld_opt.page_slots[c] << MLD_SLOT_SHIFT;
    outf(o, "%s\n{\"class\":%u,\"size\":%u,\"page_bytes\":%zu,\"objs_per_page\":%zu,\"nmalloc\":%llu,\"nfree\":%llu,"
            "\"nrequests\":%llu,\"curobjs\":%llu,\"nrefills\":%llu,\"npages\":%llu,\"npages_cached\":%llu,"
            "\"npages_released\":%llu,\"curpages\":%llu}",
         first ? "" : ",", c, mld_class_size[c], page_bytes, page_bytes / mld_class_size[c],
         (unsigned long long)cs->nmalloc, (unsigned long long)cs->nfree, (unsigned long long)cs->nmalloc,
         (unsigned long long)(cs->nmalloc >= cs->nfree ? cs->nmalloc - cs->nfree : 0),
         (unsigned long long)cs->nrefills, (unsigned long long)cs->npages, (unsigned long long)cs->npages_cached,
         (unsigned long long)cs->npages_released,
         (unsigned long long)(cs->npages >= cs->npages_released ? cs->npages - cs->npages_released : 0));
    first = false;
  }
  outf(o, "]}}\n");
}

static void print_text(out_t *o, const global_stats_t *g, const heap_stats_t *hs, bool arenas, bool classes) {
  outf(o, "___ Mallard statistics (version %s) ___\n", MALLARD_VERSION);
  char conf[MLD_OPTIONS_TEXT_MAX];
  mld_options_format(conf, sizeof conf);
  o->cb(o->opaque, "options: ");   /* longer than outf's buffer: written as it is */
  o->cb(o->opaque, conf);
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
       (unsigned long long)hs->remote_frees, (unsigned long long)atomic_load(&mld_invalid_count));
  unsigned n = arenas ? atomic_load(&mld_narenas) : 0;
  if (n) outf(o, "arena threads segments   dirty_KiB  purged_KiB  purges madvise  lock_ops contended wait_us\n");
  for (unsigned i = 0; i < n; i++) {
    arena_snapshot_t s;
    mld_arena_snapshot(i, &s);
    outf(o, "%5u %7u %8llu %11llu %11llu %7llu %7llu %9llu %9llu %7llu\n", i, s.nthreads,
         (unsigned long long)s.nsegments, (unsigned long long)s.dirty_bytes / 1024,
         (unsigned long long)s.purged_bytes / 1024, (unsigned long long)s.npurge_passes,
         (unsigned long long)s.nmadvise, (unsigned long long)s.lock.ops, (unsigned long long)s.lock.contended,
         (unsigned long long)s.lock.wait_ns / 1000);
  }
  if (classes) outf(o, "class size_B page_KiB objs/page     nmalloc       nfree     curobjs   refills  pages cur_pages\n");
  for (unsigned c = 0; classes && c < MLD_NUM_CLASSES; c++) {
    const class_stats_t *cs = &hs->cls[c];
    if (!cs->nmalloc && !cs->npages) continue;
    size_t page_bytes = (size_t)mld_opt.page_slots[c] << MLD_SLOT_SHIFT;
    outf(o, "%5u %6u %8zu %9zu %11llu %11llu %11llu %9llu %6llu %9llu\n", c, mld_class_size[c], page_bytes / 1024,
         page_bytes / mld_class_size[c], (unsigned long long)cs->nmalloc, (unsigned long long)cs->nfree,
         (unsigned long long)(cs->nmalloc >= cs->nfree ? cs->nmalloc - cs->nfree : 0),
         (unsigned long long)cs->nrefills, (unsigned long long)cs->npages,
         (unsigned long long)(cs->npages >= cs->npages_released ? cs->npages - cs->npages_released : 0));
  }
}

MLD_EXPORT void mallard_stats_print(void (*write_cb)(void *, const char *), void *opaque, const char *opts) {
  mld_ensure_init();
  out_t o = { write_cb ? write_cb : default_write, opaque };
  bool json = opts && strchr(opts, 'J'), arenas = !(opts && strchr(opts, 'a')), classes = !(opts && strchr(opts, 'b'));
  global_stats_t g;
  heap_stats_t hs;
  mld_global_stats(&g);
  mld_stats_sum(&hs);
  if (json) print_json(&o, &g, &hs, arenas, classes);
  else print_text(&o, &g, &hs, arenas, classes);
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
