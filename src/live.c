/* live.c — statistics of another running process: the root structure it exports, and the reader that copies its counters. */
#define _GNU_SOURCE
#include "internal.h"
#include "mallard.h"
#include "stats.h"
#include "prof.h"
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

/* The root: where the report's inputs are, for a reader in another process (mallard stats PID). It is a constant
 * (relocated once by the loader, in read-only memory): nothing is written at run time, so it costs nothing.
 * Version 1 (docs/STATS.md): the header (magic, version, size) never moves; a reader refuses another version, and a
 * different layout of what it copies (layout facts), library version or size-class table. */
#define LIVE_MAGIC "MLDLIVE"          /* 8 bytes with its NUL */
#define LIVE_VERSION 1u
#define LIVE_MAX_HEAPS 65536u         /* bound of the heap-list walk: a list changing under the reader may loop */
#define LIVE_TRIES 4                  /* heap walks retried while exiting threads move counters into dead_stats */

typedef struct live_root_s {
  char magic[8];
  uint32_t version;
  uint32_t size;                      /* sizeof(live_root_t) */
  char lib_version[16];               /* MALLARD_VERSION */
  const size_t *layout;               /* sizes and offsets of what the reader copies: equal in reader and target */
  uint32_t nlayout;
  uint32_t nclasses;
  const uint32_t *class_size;
  heap_t *const *heaps_all;           /* the registry of live heaps, linked through next_all */
  const heap_stats_t *dead_stats, *orphan_stats;
  arena_t *const *arenas;
  const _Atomic(unsigned) *narenas;
  const _Atomic(uint64_t) *huge_active, *huge_cached, *meta_bytes, *mapped_bytes, *invalid_count;
  const options_t *opt;
  const prof_options_t *prof_opt;
  const unsigned *auto_arenas;
  const uint64_t *start_ms;
  const _Atomic(int) *initialized;
} live_root_t;

static const size_t live_layout[] = {
  sizeof(void *), MLD_NUM_CLASSES, MLD_MAX_ARENAS, MLD_SLOT_SIZE, MLD_USABLE_SLOTS, MLD_HUGE_HEADER,
  sizeof(heap_t), offsetof(heap_t, next_all), offsetof(heap_t, stats), sizeof(heap_stats_t), sizeof(class_stats_t),
  sizeof(arena_t), offsetof(arena_t, lock_stats), offsetof(arena_t, nthreads), offsetof(arena_t, nthreads_total),
  offsetof(arena_t, nsegments), offsetof(arena_t, dirty_slots), offsetof(arena_t, purged_slots),
  offsetof(arena_t, npurge_passes), offsetof(arena_t, large_active), sizeof(lock_stats_t),
  sizeof(options_t), offsetof(options_t, page_slots), offsetof(options_t, huge_cache_max),
  offsetof(options_t, page_cache), offsetof(options_t, stats_print_opts), offsetof(options_t, zero_on_free),
  offsetof(options_t, secure_noaccess_min), offsetof(options_t, junk),
  sizeof(prof_options_t), offsetof(prof_options_t, prefix),
};

MLD_EXPORT const live_root_t mallard_live_root = {
  LIVE_MAGIC, LIVE_VERSION, sizeof(live_root_t), MALLARD_VERSION,
  live_layout, sizeof live_layout / sizeof live_layout[0], MLD_NUM_CLASSES, mld_class_size,
  &mld_heaps_all, &mld_dead_stats, &mld_orphan_stats, mld_arenas, &mld_narenas,
  &mld_huge_active, &mld_huge_cached, &mld_meta_bytes, &mld_mapped_bytes, &mld_invalid_count,
  &mld_opt, &mld_prof_opt, &mld_auto_arenas, &mld_start_ms, &mld_initialized,
};

/* ---- reading another process's memory: the kernel allows it to the same user (ptrace rules) or root ---- */
static int rd(pid_t pid, const void *addr, void *buf, size_t n) {
  struct iovec l = { buf, n }, r = { (void *)(uintptr_t)addr, n };
  ssize_t got = syscall(SYS_process_vm_readv, pid, &l, 1UL, &r, 1UL, 0UL);
  if (got == (ssize_t)n) return 0;
  return got < 0 ? errno : EFAULT;   /* a partial read: part of the range is not mapped (any more) */
}

/* next_all and stats of one remote heap, in one call. */
static int rd_heap(pid_t pid, const heap_t *h, heap_t **next, heap_stats_t *st) {
  struct iovec l[2] = { { next, sizeof *next }, { st, sizeof *st } };
  struct iovec r[2] = { { (char *)(uintptr_t)h + offsetof(heap_t, next_all), sizeof *next },
                        { (char *)(uintptr_t)h + offsetof(heap_t, stats), sizeof *st } };
  ssize_t got = syscall(SYS_process_vm_readv, pid, l, 2UL, r, 2UL, 0UL);
  if (got == (ssize_t)(sizeof *next + sizeof *st)) return 0;
  return got < 0 ? errno : EFAULT;
}

/* The heap counters summed: exited threads, threads without a heap, then the live heaps. Without the registry lock
 * a thread exiting during the walk may be counted twice or not at all: the walk is repeated while dead_stats moves. */
static int remote_heaps(pid_t pid, const live_root_t *r, heap_stats_t *sum) {
  static heap_stats_t dead, dead2, one;   /* never written concurrently: the reader holds live_lock */
  int e = 0;
  for (int t = 0; t < LIVE_TRIES; t++) {
    heap_t *h;
    if ((e = rd(pid, r->dead_stats, &dead, sizeof dead)) || (e = rd(pid, r->orphan_stats, &one, sizeof one)) ||
        (e = rd(pid, r->heaps_all, &h, sizeof h)))
      return e;
    memset(sum, 0, sizeof *sum);
    mld_stats_add(sum, &dead);
    mld_stats_add(sum, &one);
    for (unsigned n = 0; h && n < LIVE_MAX_HEAPS; n++) {
      if (rd_heap(pid, h, &h, &one)) break;   /* a stale link read mid-change: the rest is not counted this time */
      mld_stats_add(sum, &one);
    }
    if (rd(pid, r->dead_stats, &dead2, sizeof dead2) || !memcmp(&dead, &dead2, sizeof dead)) break;
  }
  return 0;
}

static int remote_u64(pid_t pid, const void *addr, uint64_t *v) { return rd(pid, addr, v, sizeof *v); }

/* Is one of the process's threads the purging thread (background.c names it)? Read without allocating. */
static bool remote_purge_thread(pid_t pid) {
  char path[64], buf[4096];
  snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
  int dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return false;
  bool found = false;
  long n;
  while (!found && (n = syscall(SYS_getdents64, dfd, buf, sizeof buf)) > 0) {
    for (long off = 0; off < n && !found;) {
      const char *d_name = buf + off + 19;   /* struct linux_dirent64: ino 8, off 8, reclen 2, type 1, name */
      unsigned short reclen;
      memcpy(&reclen, buf + off + 16, sizeof reclen);
      if (!reclen) break;
      off += reclen;
      if (d_name[0] < '0' || d_name[0] > '9') continue;
      char cpath[96], comm[32];
      snprintf(cpath, sizeof cpath, "/proc/%d/task/%.20s/comm", (int)pid, d_name);
      int fd = open(cpath, O_RDONLY | O_CLOEXEC);
      if (fd < 0) continue;
      ssize_t k = read(fd, comm, sizeof comm - 1);
      close(fd);
      comm[k > 0 ? k : 0] = 0;
      found = !strcmp(comm, "mallard-purge\n");
    }
  }
  close(dfd);
  return found;
}

static int check_root(pid_t pid, const live_root_t *r) {
  const live_root_t *mine = &mallard_live_root;
  if (strncmp(r->lib_version, MALLARD_VERSION, sizeof r->lib_version) || r->nlayout != mine->nlayout ||
      r->nclasses != MLD_NUM_CLASSES)
    return EPROTO;
  size_t layout[sizeof live_layout / sizeof live_layout[0]];
  uint32_t classes[MLD_NUM_CLASSES];
  int e;
  if ((e = rd(pid, r->layout, layout, sizeof layout)) || (e = rd(pid, r->class_size, classes, sizeof classes)))
    return e;
  if (memcmp(layout, live_layout, sizeof layout) || memcmp(classes, mld_class_size, sizeof classes)) return EPROTO;
  return 0;
}

static int remote_snapshot(pid_t pid, const live_root_t *r, stats_snapshot_t *s) {
  static arena_t a;        /* ~1.5 KiB: off the stack; the reader holds live_lock */
  static options_t o;
  static prof_options_t po;
  int e, init;
  unsigned n, auto_arenas;
  arena_t *ptrs[MLD_MAX_ARENAS];
  stats_atomics_t at;
  uint64_t start_ms;
  if ((e = rd(pid, r->initialized, &init, sizeof init))) return e;
  if (init != 2) return EAGAIN;   /* not initialised yet (or being initialised): nothing to read */
  if ((e = rd(pid, r->narenas, &n, sizeof n)) || (e = rd(pid, r->arenas, ptrs, sizeof ptrs)) ||
      (e = rd(pid, r->opt, &o, sizeof o)) || (e = rd(pid, r->prof_opt, &po, sizeof po)) || (e = rd(pid, r->auto_arenas, &auto_arenas, sizeof auto_arenas)) ||
      (e = rd(pid, r->start_ms, &start_ms, sizeof start_ms)) || (e = remote_u64(pid, r->huge_active, &at.huge_active)) ||
      (e = remote_u64(pid, r->huge_cached, &at.huge_cached)) || (e = remote_u64(pid, r->meta_bytes, &at.meta_bytes)) ||
      (e = remote_u64(pid, r->mapped_bytes, &at.mapped_bytes)) ||
      (e = remote_u64(pid, r->invalid_count, &s->invalid_frees)) || (e = remote_heaps(pid, r, &s->hs)))
    return e;
  s->narenas = 0;
  for (unsigned i = 0; i < n && i < MLD_MAX_ARENAS; i++) {
    if (!ptrs[i] || rd(pid, ptrs[i], &a, sizeof a)) break;   /* arenas are never freed: a failure is a torn read */
    mld_arena_snapshot_of(&a, &s->arenas[s->narenas++]);
  }
  mld_global_compute(&s->g, &s->hs, s->arenas, s->narenas, &at);
  mld_snapshot_options(s, &o, &po, auto_arenas);
  s->pid = (int)pid;
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/exe", (int)pid);
  ssize_t xl = readlink(path, s->exe, sizeof s->exe - 1);
  s->exe[xl > 0 ? xl : 0] = 0;
  uint64_t now = mld_now_ms();   /* CLOCK_MONOTONIC_COARSE: the same clock in every process of this boot */
  s->uptime_ms = now >= start_ms ? now - start_ms : 0;
  cpu_set_t set;
  int nc = sched_getaffinity(pid, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
  s->ncpus = nc > 0 ? (size_t)nc : mld_ncpus();
  s->purge_running = remote_purge_thread(pid);
  s->purge_wakeups_known = false;   /* background.c keeps its counter private: not in the root */
  return 0;
}

/* One reader at a time: its buffers are static (the snapshot is ~12 KiB), and it never allocates. */
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;

MLD_EXPORT int mallard_live_stats(int pid, uintptr_t root_addr, void (*write_cb)(void *, const char *), void *opaque,
                                  const char *opts) {
  static stats_snapshot_t snap;
  static live_root_t root;
  if (pid <= 0 || !root_addr || !write_cb) return EINVAL;
  pthread_mutex_lock(&live_lock);
  /* The header first: a root of another version may be of another size. */
  int e = rd((pid_t)pid, (const void *)root_addr, &root, offsetof(live_root_t, lib_version));
  if (!e && (memcmp(root.magic, LIVE_MAGIC, sizeof root.magic) || root.version != LIVE_VERSION ||
             root.size != sizeof root))
    e = EPROTO;
  if (!e) e = rd((pid_t)pid, (const void *)root_addr, &root, sizeof root);
  if (!e) e = check_root((pid_t)pid, &root);
  if (!e) e = remote_snapshot((pid_t)pid, &root, &snap);
  if (!e) mld_stats_print_snapshot(&snap, write_cb, opaque, opts);
  pthread_mutex_unlock(&live_lock);
  return e;
}
