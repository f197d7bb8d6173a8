/* purge.c — returning memory: decay of dirty spans, unmapping of empty segments, and the optional purging thread. */
#define _GNU_SOURCE
#include "internal.h"
#include <signal.h>
#include <time.h>

void mld_arena_maybe_purge(arena_t *a, uint64_t now) {
  if (mld_opt.dirty_decay_ms < 0) return;
  if (a->dirty_slots && now >= a->next_purge_ms) mld_arena_purge(a, false);
}

/* Purge dirty spans older than the decay delay (all of them if `all`); unmap segments left entirely free. */
size_t mld_arena_purge(arena_t *a, bool all) {
  uint64_t now = mld_now_ms();
  uint64_t decay = mld_purge_age();
  size_t bytes = 0;
  uint64_t next_due = 0;
  mld_arena_reap_abandoned(a, now);
  a->npurge_passes++;
  for (size_t n = 1; n <= MLD_USABLE_SLOTS; n++) {
    for (page_t *pg = a->spans[n]; pg; ) {
      page_t *next = pg->next;
      if (!pg->purged) {
        if (all || now - pg->dirty_since >= decay) {
          size_t len = n << MLD_SLOT_SHIFT;
          mld_os_purge(page_start(pg), len);
          a->nmadvise++;
          a->purged_bytes_total += len;
          bytes += len;
          pg->purged = 1;
          pg->zero = 1;
          a->dirty_slots -= n;
          a->purged_slots += n;
        } else if (!next_due || pg->dirty_since + decay < next_due) {
          next_due = pg->dirty_since + decay;
        }
      }
      if (n == MLD_USABLE_SLOTS && pg->purged && !mld_opt.retain) mld_segment_release(a, segment_of(pg));
      pg = next;
    }
  }
  a->next_purge_ms = next_due;
  return bytes;
}

/* Purge every arena now (force) or what is due, and the huge cache. */
void mld_purge_all(bool force) {
  unsigned n = atomic_load(&mld_narenas);
  for (unsigned i = 0; i < n; i++) {
    arena_t *a = mld_arenas[i];
    mld_lock(&a->lock, &a->lock_stats);
    if (force) mld_arena_purge(a, true); else mld_arena_maybe_purge(a, mld_now_ms());
    pthread_mutex_unlock(&a->lock);
  }
  mld_huge_cache_purge(force);
}

/* ---- the purging thread: started on the first dirty span, sleeps until the next span is due ---- */
static pthread_mutex_t bg_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t bg_cond;
static _Atomic(int) bg_started;           /* 0 not started, 1 started (or starting), -1 failed: do not retry */
static _Atomic(int) bg_idle;              /* the thread waits without a deadline */
static _Atomic(uint64_t) bg_wakeups;
static _Atomic(int) bg_suspended;         /* set around fork(): no thread is started from the fork handlers */

static bool any_dirty(uint64_t *due) {
  uint64_t best = mld_huge_cache_due();
  bool dirty = best != 0;
  unsigned n = atomic_load(&mld_narenas);
  for (unsigned i = 0; i < n; i++) {
    arena_t *a = mld_arenas[i];
    if (__atomic_load_n(&a->dirty_slots, __ATOMIC_RELAXED)) {   /* racy read: only picks the wake-up time */
      uint64_t d = __atomic_load_n(&a->next_purge_ms, __ATOMIC_RELAXED);
      if (!best || d < best) best = d;
      dirty = true;
    }
  }
  if (dirty && !best) best = mld_now_ms() + mld_purge_age();
  *due = best;
  return dirty;
}

static void *bg_main(void *arg) {
  (void)arg;
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, NULL);   /* never run the program's signal handlers */
  for (;;) {
    uint64_t due;
    pthread_mutex_lock(&bg_lock);
    if (!any_dirty(&due)) {
      atomic_store(&bg_idle, 1);
      pthread_cond_wait(&bg_cond, &bg_lock);
      atomic_store(&bg_idle, 0);
      pthread_mutex_unlock(&bg_lock);
      continue;
    }
    uint64_t now = mld_now_ms();
    if (due > now) {
      struct timespec ts;
      clock_gettime(CLOCK_MONOTONIC, &ts);
      uint64_t wait = due - now + 5;          /* the coarse clock lags a few ms */
      ts.tv_sec += (time_t)(wait / 1000);
      ts.tv_nsec += (long)(wait % 1000) * 1000000L;
      if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
      pthread_cond_timedwait(&bg_cond, &bg_lock, &ts);
    }
    pthread_mutex_unlock(&bg_lock);
    atomic_fetch_add(&bg_wakeups, 1);
    mld_purge_all(false);
  }
  return NULL;
}

static void bg_cond_init(void) {
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&bg_cond, &ca);
  pthread_condattr_destroy(&ca);
}

void mld_dirty_notify(void) {
  if (!mld_opt.background_thread || mld_opt.dirty_decay_ms <= 0 || atomic_load(&bg_suspended)) return;
  int st = atomic_load_explicit(&bg_started, memory_order_relaxed);
  if (likely(st == 1)) {
    if (atomic_load_explicit(&bg_idle, memory_order_relaxed)) {
      pthread_mutex_lock(&bg_lock);
      pthread_cond_signal(&bg_cond);
      pthread_mutex_unlock(&bg_lock);
    }
    return;
  }
  if (st != 0 || atomic_load(&mld_initialized) != 2) return;
  int expect = 0;
  if (!atomic_compare_exchange_strong(&bg_started, &expect, 1)) return;
  bg_cond_init();
  pthread_t t;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&attr, 64 * 1024);
  if (pthread_create(&t, &attr, bg_main, NULL) != 0) atomic_store(&bg_started, -1);
  else pthread_setname_np(t, "mallard-purge");
  pthread_attr_destroy(&attr);
}

bool mld_purge_thread_running(void) { return atomic_load(&bg_started) == 1; }
uint64_t mld_purge_thread_wakeups(void) { return atomic_load(&bg_wakeups); }

void mld_purge_fork_prepare(void) { atomic_store(&bg_suspended, 1); pthread_mutex_lock(&bg_lock); }
void mld_purge_fork_parent(void) { pthread_mutex_unlock(&bg_lock); atomic_store(&bg_suspended, 0); }
void mld_purge_fork_child(void) {
  /* The thread does not exist in the child: start afresh when dirty memory appears there. */
  pthread_mutex_init(&bg_lock, NULL);
  if (atomic_load(&bg_started) == 1) atomic_store(&bg_started, 0);
  atomic_store(&bg_idle, 0);
  atomic_store(&bg_suspended, 0);
}
