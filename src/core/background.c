/* core/background.c — the purging thread (started lazily, woken by free paths, sweeps and purges what falls due) and purge_all. */
#define _GNU_SOURCE
#include "core/core.h"
#include <signal.h>
#include <time.h>

/* Purge every arena now (force) or what is due, and the huge cache; returns the bytes given back. */
size_t mld_purge_all(bool force) {
  size_t bytes = 0;
  unsigned n = atomic_load(&mld_narenas);
  for (unsigned i = 0; i < n; i++) {
    arena_t *a = mld_arenas[i];
    mld_lock(&a->lock, &a->lock_stats);
    bytes += force ? mld_arena_purge(a, true) : mld_arena_maybe_purge(a, mld_now_ms());
    pthread_mutex_unlock(&a->lock);
  }
  return bytes + mld_huge_cache_purge(force) + mld_large_quarantine_purge(force);
}

/* ---- the purging thread ----
 * It is never started from free() or from a collection: glibc frees thread control blocks while holding its
 * stack-cache lock, and pthread_create takes that lock (a free that started the thread deadlocked), and a
 * collection may run with the heap's lists half updated. It is started from an allocation slow path (a new
 * page, span or huge mapping), at its end, with none of Mallard's locks held, once the process has mapped more
 * than BG_START_BYTES or freed memory waits: small programs never get one. Its own pthread_create allocates
 * (TLS) through Mallard; bg_started is already 1 then, so that nested call does not start another.
 * Wake-ups: free paths only signal. A notifier stores bg_pending then reads bg_idle; the thread stores bg_idle
 * then exchanges bg_pending (all sequentially consistent): at least one of the two sees the other's store, so a
 * notification is never lost (the thread rechecks bg_pending under bg_lock before each wait). */
#define BG_START_BYTES ((uint64_t)8 << 20)

__thread bool mld_self_alloc;

static pthread_mutex_t bg_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t bg_cond;
static _Atomic(int) bg_started;           /* 0 not started (or failed: retried after bg_retry_ms), 1 started or starting */
static _Atomic(int) bg_idle;              /* the thread waits without a deadline */
static _Atomic(int) bg_pending;           /* dirty memory appeared since the thread last looked */
static _Atomic(uint64_t) bg_wakeups;
static _Atomic(int) bg_suspended;         /* set around fork(): no thread is started from the fork handlers */
/* Set in a fork child until the program starts a thread there: the child's allocations start no purging thread
 * (see mld_purge_fork_child). bg_fork_thread: the thread that forked, the child's only thread at first. */
static _Atomic(int) bg_forked;
static pthread_t bg_fork_thread;
/* Held while the purging thread is being created, and taken first by the fork handlers (init.c): no fork happens in
 * the middle of a creation (under qemu-user that leaves qemu's own thread-creation lock held in the child for ever:
 * docs/PLATFORMS.md). The creation allocates (the thread's TLS) with it held, so it comes before every other lock. */
static pthread_mutex_t bg_create_lock = PTHREAD_MUTEX_INITIALIZER;
static mld_thread_boot_t bg_boot;   /* the purging thread's start record (static: its creator does not wait for it) */

static bool bg_enabled(void) { return mld_opt.background_thread && mld_opt.dirty_decay_ms > 0; }

/* Is any dirty memory waiting, and when is the first of it due? Arena locks are taken (bg_lock, then arenas:
 * the order of the fork handlers). */
static bool any_dirty(uint64_t *due) {
  uint64_t best = mld_huge_cache_due(), sweep = mld_sweep_due(), quarantine = mld_large_quarantine_due();
  if (sweep && (!best || sweep < best)) best = sweep;
  if (quarantine && (!best || quarantine < best)) best = quarantine;
  bool dirty = best != 0;
  unsigned n = atomic_load(&mld_narenas);
  for (unsigned i = 0; i < n; i++) {
    uint64_t d = mld_arena_next_due(mld_arenas[i], &dirty);
    if (d && (!best || d < best)) best = d;
  }
  if (dirty && !best) best = mld_now_ms() + mld_purge_age();
  *due = best;
  return dirty;
}

static void *bg_main(void *arg) {
  (void)arg;
  /* Started with every signal blocked (mld_thread_start): it never runs the program's signal handlers. */
  for (;;) {
    uint64_t due;
    pthread_mutex_lock(&bg_lock);
    atomic_store(&bg_idle, 1);
    bool pending = atomic_exchange(&bg_pending, 0);
    MLD_RACE_WINDOW();
    if (!any_dirty(&due)) {
      /* A notification after the exchange above sets bg_pending again: wait only while it is clear. */
      while (!pending && !atomic_load(&bg_pending)) pthread_cond_wait(&bg_cond, &bg_lock);
      atomic_store(&bg_idle, 0);
      pthread_mutex_unlock(&bg_lock);
      continue;
    }
    atomic_store(&bg_idle, 0);
    uint64_t now = mld_now_ms();
    if (due > now) {
      struct timespec ts;
      mld_deadline_after_ms(&ts, due - now + 5);   /* the coarse clock lags a few ms */
      pthread_cond_timedwait(&bg_cond, &bg_lock, &ts);
    }
    pthread_mutex_unlock(&bg_lock);
    atomic_fetch_add(&bg_wakeups, 1);
    mld_heaps_sweep(false);   /* before purging: what it gives back starts its decay now */
    mld_purge_all(false);
  }
  return NULL;
}

/* At initialisation (no allocation): the condition variable waits on the monotonic clock. */
void mld_purge_init(void) {
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&bg_cond, &ca);
  pthread_condattr_destroy(&ca);
}

/* Wake the purging thread, if started, from whatever wait it is in. */
static void bg_signal(void) {
  if (atomic_load(&bg_started) != 1) return;
  pthread_mutex_lock(&bg_lock);
  pthread_cond_signal(&bg_cond);
  pthread_mutex_unlock(&bg_lock);
}

/* Free paths: dirty memory appeared. Never starts a thread, never allocates. */
void mld_dirty_notify(void) {
  if (!bg_enabled()) return;
  /* Already pending: the thread has not yet exchanged it, so it will look (and see this dirty memory, published
   * under an arena lock before this load). Skipping the store keeps every freeing thread off one shared line. */
  if (atomic_load(&bg_pending)) return;
  atomic_store(&bg_pending, 1);
  if (atomic_load(&bg_idle)) bg_signal();
}

/* A sweep or a reap was asked for: it falls due within the sweep age, possibly long before the deadline the thread
 * waits for (the decay of dirty spans: seconds), and mld_dirty_notify wakes only a thread waiting without a deadline.
 * Signalled whatever the thread does (at most once per request: mld_sweep_want, mld_sweep_want_soon,
 * mld_arena_want_reap). Never starts a thread, never allocates. */
void mld_purge_wake(void) {
  if (!bg_enabled()) return;
  atomic_store(&bg_pending, 1);
  bg_signal();
}

#define BG_RETRY_MS 1000
static _Atomic(uint64_t) bg_retry_ms;    /* after a failed start: not before this time */

/* The purging thread, detached; stack_size 0: the default. */
static int bg_create(pthread_t *t, size_t stack_size) {
  bg_boot.fn = bg_main;
  return mld_thread_start(t, &bg_boot, stack_size);
}

/* Allocation slow paths, at their end, no lock held: start the purging thread once it is worth having. */
void mld_purge_thread_maybe_start(void) {
  if (likely(atomic_load_explicit(&bg_started, memory_order_relaxed) != 0)) return;
  if (!bg_enabled() || atomic_load(&bg_suspended) || atomic_load(&bg_forked) || atomic_load(&mld_initialized) != 2)
    return;
  if (atomic_load_explicit(&mld_mapped_bytes, memory_order_relaxed) < BG_START_BYTES && !atomic_load(&bg_pending)) return;
  uint64_t retry = atomic_load_explicit(&bg_retry_ms, memory_order_relaxed);
  if (retry && mld_now_ms() < retry) return;
  MLD_RACE_WINDOW();   /* test builds: a fork may take bg_create_lock here */
  /* bg_started goes to 1 only under bg_create_lock: a fork handler holding it that reads 1 waits for a thread
   * already created; set before the lock, the handler waited for a thread whose creator waited for the lock. */
  pthread_mutex_lock(&bg_create_lock);
  int expect = 0;
  if (!atomic_compare_exchange_strong(&bg_started, &expect, 1)) {
    pthread_mutex_unlock(&bg_create_lock);
    return;
  }
  pthread_t t;
  bool was_self = mld_self_alloc;
  mld_self_alloc = true;                  /* the thread's TLS is Mallard's, not the program's: never sampled */
  /* A small stack first (the thread needs little); glibc carves the program's static TLS out of it, so a
   * program with much static TLS gets EINVAL: then the default size. */
  int rc = bg_create(&t, 64 * 1024);
  if (rc != 0) rc = bg_create(&t, 0);
  if (rc != 0) {   /* under the lock: a fork handler that reads bg_started 1 after it waits for a thread that runs */
    atomic_store(&bg_retry_ms, mld_now_ms() + BG_RETRY_MS);   /* e.g. EAGAIN: tried again later, not never */
    atomic_store(&bg_started, 0);
  }
  pthread_mutex_unlock(&bg_create_lock);
  mld_self_alloc = was_self;
  if (rc == 0) pthread_setname_np(t, "mallard-purge");
}

/* A heap was made for the calling thread (heap.c): in a fork child, a thread other than the forking one means the
 * program runs threads there itself, and the purging thread may start again. */
void mld_purge_new_heap(void) {
  if (unlikely(atomic_load_explicit(&bg_forked, memory_order_relaxed)) && !pthread_equal(pthread_self(), bg_fork_thread))
    atomic_store(&bg_forked, 0);
}

bool mld_purge_thread_running(void) { return atomic_load(&bg_started) == 1; }
bool mld_purge_thread_booted(void) { return atomic_load(&bg_boot.started) == 1; }
uint64_t mld_purge_thread_wakeups(void) { return atomic_load(&bg_wakeups); }

/* The fork handlers' first step: no creation in progress, and a thread created runs already (mld_thread_wait_started:
 * its creator did not wait). */
void mld_purge_create_lock(void) {
  pthread_mutex_lock(&bg_create_lock);
  if (atomic_load(&bg_started) == 1) mld_thread_wait_started(&bg_boot);
}
void mld_purge_create_unlock(void) { pthread_mutex_unlock(&bg_create_lock); }
void mld_purge_fork_prepare(void) { atomic_store(&bg_suspended, 1); pthread_mutex_lock(&bg_lock); }
void mld_purge_fork_parent(void) { pthread_mutex_unlock(&bg_lock); atomic_store(&bg_suspended, 0); }
/* The thread does not exist in the child, and none is started for it while the forking thread is the child's only
 * one: a program may call only async-signal-safe functions in the child of a threaded parent, so Mallard does not
 * make the child threaded behind its back (jemalloc disables its background threads in a child too). Under
 * qemu-user it would hang: qemu's own clone lock, held by another parent thread that was starting or ending at
 * the fork, stays held in the child, and the child's first thread creation waits on it for ever. Until then the
 * child purges as with background_thread:false (on its allocation and free paths); once the program starts a
 * thread of its own there (mld_purge_new_heap), the purging thread may start as in any process. */
void mld_purge_fork_child(void) {
  bg_fork_thread = pthread_self();
  atomic_store(&bg_forked, 1);
  pthread_mutex_init(&bg_create_lock, NULL);
  pthread_mutex_init(&bg_lock, NULL);
  mld_purge_init();   /* the parent's thread may have been waiting on it: the child's copy counts a phantom waiter */
  if (atomic_load(&bg_started) == 1) atomic_store(&bg_started, 0);
  atomic_store(&bg_idle, 0);
  atomic_store(&bg_suspended, 0);
}

/* Give back what can be given back now: the calling thread's heap, other threads' idle pages and the exit heap's
 * (sweeps), then the arenas' dirty memory (all of it with force; else what its delay has released). Returns the bytes
 * returned to the OS. mallard_collect, malloc_trim and jemalloc's arena.N.purge/decay come here. */
size_t mld_collect(bool force) {
  mld_heap_collect(mld_tls_heap, force);
  mld_heaps_sweep(force);   /* other threads' idle parked pages and the exit heap's empty ones go back to arenas */
  return mld_purge_all(force);
}
