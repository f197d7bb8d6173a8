/* prof/dump.c — heap profiling's outputs: profile dumps (prof.dump, prof_interval, prof_signal, prof_final) through
 * the pprof writer, the dump thread that serves signals, and the leak summary at exit. */
#define _GNU_SOURCE
#include "prof/prof.h"
#include "prof/pprof.h"
#include <dlfcn.h>
#include <errno.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static _Atomic(uint64_t) dump_seq;           /* the SEQ of PREFIX.PID.SEQ.pb.gz */
static _Atomic(uint64_t) dumps_written;
static _Atomic(uint64_t) interval_acc;       /* estimated bytes toward the next interval dump; always < prof_interval */
static _Atomic(int) interval_pending;        /* an interval was crossed: the next sample in a safe context dumps */
static _Atomic(int) signal_pending;          /* set by the signal handler, cleared by whoever dumps */
static sem_t signal_sem;                     /* posted by the handler (sem_post is async-signal-safe) */
static _Atomic(int) thread_state;            /* dump thread: 0 none, 1 starting or running */

uint64_t mld_prof_dumps(void) { return atomic_load(&dumps_written); }

/* ---- one dump ---- */
typedef struct iter_s { prof_snap_t *a; size_t n, i; } iter_t;

static int64_t round64(double x) { return x <= 0 ? 0 : x >= 9.2e18 ? INT64_MAX : (int64_t)(x + 0.5); }

static bool next_sample(void *ctx, mld_pprof_sample_t *out) {
  iter_t *it = ctx;
  if (it->i >= it->n) return false;
  const prof_snap_t *s = &it->a[it->i++];
  out->pcs = s->st->pcs;   /* stacks are never freed: valid after the lock is released */
  out->depth = s->st->depth;
  out->alloc_objects = round64(s->ao);
  out->alloc_space = round64(s->as);
  out->inuse_objects = round64(s->io);
  out->inuse_space = round64(s->is);
  return true;
}

/* The profile is written from a snapshot, without the profiler lock: the writer reads the loader's lists (dladdr,
 * dl_iterate_phdr), and a thread inside dlopen that holds the loader's lock may be waiting for the profiler's. */
static int dump_to(const char *path) {
  bool was_busy = mld_self_alloc;
  mld_self_alloc = true;
  prof_snap_t *a;
  int64_t start;
  size_t bytes, n = mld_prof_snapshot_at(&a, &bytes, &start);
  int err = ENOMEM;
  if (a) {
    int64_t now = (int64_t)mld_realtime_ns();
    mld_pprof_info_t info = { start, now - start, (int64_t)mld_prof_mean() };
    iter_t it = { a, n, 0 };
    err = mld_pprof_write_file(path, &info, next_sample, &it);
    mld_os_unmap_plain(a, bytes);
  }
  if (!err) atomic_fetch_add(&dumps_written, 1);
  mld_self_alloc = was_busy;
  return err;
}

static int dump_auto(const char *what) {
  char path[MLD_PROF_PREFIX_MAX + 64];
  if (what) snprintf(path, sizeof path, "%s.%d.%s.pb.gz", mld_prof_opt.prefix, (int)getpid(), what);
  else snprintf(path, sizeof path, "%s.%d.%llu.pb.gz", mld_prof_opt.prefix, (int)getpid(),
                (unsigned long long)atomic_fetch_add(&dump_seq, 1));
  int err = dump_to(path);
  if (err) mld_message("mallard: prof: cannot write %s (%s)\n", path, mld_errname(err));
  return err;
}

int mld_prof_dump(const char *path) {
  if (!mld_prof_opt.prof) return EPERM;
  mld_ensure_init();
  if (path) return dump_to(path);
  return dump_auto(NULL);
}

/* ---- prof_signal: the handler only posts; the dump thread (or, before it runs, the next sample) writes ---- */
static void on_signal(int sig) {
  (void)sig;
  int saved = errno;
  atomic_store(&signal_pending, 1);
  sem_post(&signal_sem);
  errno = saved;
}

static void *dump_thread(void *arg) {
  (void)arg;
  for (;;) {
    while (sem_wait(&signal_sem) != 0) {}
    if (atomic_exchange(&signal_pending, 0)) dump_auto(NULL);
  }
  return NULL;
}

void mld_prof_dump_boot(void) {
  if (!mld_prof_opt.signal) return;
  sem_init(&signal_sem, 0, 0);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  if (sigaction(mld_prof_opt.signal, &sa, NULL) != 0) {
    int err = errno;
    mld_message("mallard: prof: prof_signal:%s: cannot install a handler (%s); no profile will be written on that "
                "signal\n", mld_prof_opt.signame, mld_errname(err));
    mld_prof_opt.signal = 0;   /* no dump thread, no pending dumps: the signal keeps its default action */
  }
}

void mld_prof_dump_fork_child(void) {
  atomic_store(&thread_state, 0);   /* the dump thread did not cross fork: the child's next safe sample starts one */
  if (mld_prof_opt.signal) sem_init(&signal_sem, 0, 0);
}

/* prof_interval: adds a sample's estimate; true when it crosses the interval. The counter keeps only the remainder
 * (below the interval): a sample worth several intervals crosses once, and the next interval starts from what is left
 * over, so that one sample larger than the interval cannot leave the counter stuck above it. */
static bool interval_add(double est_bytes) {
  uint64_t iv = mld_prof_opt.interval;
  uint64_t add = est_bytes >= 4.0e18 ? (uint64_t)4e18 : est_bytes > 0 ? (uint64_t)est_bytes : 0;
  uint64_t acc = atomic_load_explicit(&interval_acc, memory_order_relaxed), next;
  bool crossed;
  do {
    uint64_t sum;
    if (__builtin_add_overflow(acc, add, &sum)) sum = UINT64_MAX;   /* acc < 2^40, add <= 4e18: cannot happen */
    crossed = sum >= iv;
    next = crossed ? sum % iv : sum;
  } while (!atomic_compare_exchange_weak_explicit(&interval_acc, &acc, next, memory_order_relaxed,
                                                  memory_order_relaxed));
  return crossed;
}

/* After each sample, no lock held, mld_self_alloc set. Dumps are written only in a safe context (no dlopen in
 * progress in any thread, not inside fork): the writer walks the loader's lists (dl_iterate_phdr, dladdr1), which a
 * dlopen in its mapping phase has half updated. A dump due in an unsafe context waits for the next safe sample (or,
 * for a signal, the dump thread once it runs); several crossings in the meantime give one dump. */
void mld_prof_dump_after_sample(double est_bytes) {
  if (mld_prof_opt.interval && interval_add(est_bytes)) atomic_store(&interval_pending, 1);
  if (!mld_prof_safe_context()) return;
  if (mld_prof_opt.signal && !atomic_load_explicit(&thread_state, memory_order_relaxed)) {
    int expect = 0;
    if (atomic_compare_exchange_strong(&thread_state, &expect, 1)) {
      static mld_thread_boot_t boot = { .fn = dump_thread };
      pthread_t t;   /* detached, every signal blocked from its start (mld_thread_start) */
      if (mld_thread_start(&t, &boot, 256 * 1024) != 0) atomic_store(&thread_state, 0);
      else mld_thread_wait_started(&boot);   /* no fork handler waits for this one (docs/PLATFORMS.md) */
    }
  }
  /* a signal that came before the dump thread could start (or when it cannot start): this sample writes it */
  if (mld_prof_opt.signal && atomic_load_explicit(&signal_pending, memory_order_relaxed) &&
      !atomic_load_explicit(&thread_state, memory_order_relaxed) && atomic_exchange(&signal_pending, 0))
    dump_auto(NULL);
  if (atomic_load_explicit(&interval_pending, memory_order_relaxed) && atomic_exchange(&interval_pending, 0))
    dump_auto(NULL);
}

/* ---- at exit: prof_final, prof_leak ---- */
static void put_frame(char *line, size_t len, size_t *at, uintptr_t pc) {
  Dl_info di;
  int r;
  if (!dladdr((void *)(pc - 1), &di)) memset(&di, 0, sizeof di);   /* a static musl program: dladdr always fails */
  if (di.dli_sname && di.dli_saddr)
    r = snprintf(line + *at, len - *at, " %s+0x%lx", di.dli_sname, (unsigned long)(pc - (uintptr_t)di.dli_saddr));
  else if (di.dli_fname && di.dli_fbase) {
    const char *base = strrchr(di.dli_fname, '/');
    r = snprintf(line + *at, len - *at, " %s+0x%lx", base ? base + 1 : di.dli_fname,
                 (unsigned long)(pc - (uintptr_t)di.dli_fbase));
  } else
    r = snprintf(line + *at, len - *at, " 0x%lx", (unsigned long)pc);
  if (r > 0) *at = *at + (size_t)r < len ? *at + (size_t)r : len - 1;
}

#define LEAK_TOP 10
static void leak_report(void) {
  prof_snap_t *a;
  size_t bytes, n = mld_prof_snapshot(&a, &bytes);
  if (!a) return;
  double blocks = 0, space = 0;
  for (size_t i = 0; i < n; i++) { blocks += a[i].io; space += a[i].is; }
  if (blocks < 0.5) {
    mld_message("mallard: prof_leak: no sampled block was live at exit (sampling: leaks much smaller than "
                "prof_sample:%zu bytes may go unseen)\n", mld_prof_mean());
    mld_os_unmap_plain(a, bytes);
    return;
  }
  size_t sites = 0;
  for (size_t i = 0; i < n; i++) sites += a[i].io > 0;
  mld_message("mallard: prof_leak: ~%.0f bytes in ~%.0f blocks still live at exit, from %zu sites (estimated from "
              "samples, prof_sample:%zu); top sites:\n", space, blocks, sites, mld_prof_mean());
  for (unsigned k = 0; k < LEAK_TOP; k++) {   /* selection of the largest: n is small and this runs once */
    size_t best = n;
    for (size_t i = 0; i < n; i++) if (a[i].is > 0 && (best == n || a[i].is > a[best].is)) best = i;
    if (best == n) break;
    char line[1024];
    size_t at = 0;
    int r = snprintf(line, sizeof line, "  ~%.0f bytes in ~%.0f blocks:", a[best].is, a[best].io);
    if (r > 0) at = (size_t)r;
    for (uint32_t f = 0; f < a[best].st->depth && f < 6 && at < sizeof line - 64; f++) {
      if (f) { line[at++] = ' '; line[at++] = '<'; line[at] = 0; }
      put_frame(line, sizeof line, &at, a[best].st->pcs[f]);
    }
    mld_message("%s\n", line);
    a[best].is = 0;
  }
  mld_os_unmap_plain(a, bytes);
}

/* A destructor: it runs after the program's own atexit handlers and destructors (the preloaded library is finalised
 * last), so what those free is not reported as live. */
__attribute__((destructor)) static void prof_at_exit(void) {
  if (!mld_prof_opt.prof) return;
  mld_self_alloc = true;
  if (mld_prof_opt.final) dump_auto("final");
  if (mld_prof_opt.leak) leak_report();
  mld_self_alloc = false;
}

/* ---- prof_signal's names ---- */
/* Signal s's name without "SIG" (1..31), or NULL. glibc names them; elsewhere (musl has no sigabbrev_np) Linux's
 * numbering, which every Linux C library shares, with glibc's choice among aliases (6 ABRT, 29 POLL). */
static const char *sig_abbrev(int s) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
  return sigabbrev_np(s);
#else
  static const char names[32][8] = {
    "", "HUP", "INT", "QUIT", "ILL", "TRAP", "ABRT", "BUS", "FPE", "KILL", "USR1", "SEGV", "USR2", "PIPE", "ALRM",
    "TERM", "STKFLT", "CHLD", "CONT", "STOP", "TSTP", "TTIN", "TTOU", "URG", "XCPU", "XFSZ", "VTALRM", "PROF",
    "WINCH", "POLL", "PWR", "SYS"};
  return s > 0 && s < 32 ? names[s] : NULL;
#endif
}

/* Signals that cannot be caught, or that report a fault of the program: never taken over for dumps. */
static bool sig_refused(int s) {
  return s == SIGKILL || s == SIGSTOP || s == SIGSEGV || s == SIGBUS || s == SIGILL || s == SIGFPE || s == SIGABRT ||
         s == SIGTRAP || s == SIGSYS;
}

int mld_prof_signal_parse(const char *v, size_t n) {
  if ((n == 4 && !memcmp(v, "none", 4)) || (n == 1 && v[0] == '0')) return 0;
  if (n > 3 && !memcmp(v, "SIG", 3)) { v += 3; n -= 3; }
  int sig = -1;
  if (n && n <= 2 && v[0] >= '0' && v[0] <= '9' && (n == 1 || (v[1] >= '0' && v[1] <= '9')))
    sig = n == 1 ? v[0] - '0' : (v[0] - '0') * 10 + v[1] - '0';
  else
    for (int s = 1; s < 32 && sig < 0; s++) {
      const char *a = sig_abbrev(s);
      if (a && strlen(a) == n && !memcmp(a, v, n)) sig = s;
    }
  /* 32 .. SIGRTMIN-1 are the C library's own (glibc: 32-33, musl: 32-34; thread cancellation, setxid): sigaction
   * refuses them. SIGRTMIN is read at run time (it is a function of the C library, not a constant). */
  if (sig < 1 || sig > SIGRTMAX || (sig >= 32 && sig < SIGRTMIN) || sig_refused(sig)) return -1;
  return sig;
}

void mld_prof_signal_name(int sig, char *out, size_t len) {
  const char *a = sig > 0 && sig < 32 ? sig_abbrev(sig) : NULL;
  if (!sig) snprintf(out, len, "none");
  else if (a) snprintf(out, len, "SIG%s", a);
  else snprintf(out, len, "%d", sig);
}
