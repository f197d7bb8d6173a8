/* api/init.c — initialisation (lazy and by constructor), thread-exit hook, fork handlers, and statistics at exit. */
#define _GNU_SOURCE
#include "core/core.h"
#include "core/secure.h"
#include "guarded/guarded.h"
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_t init_thread;

static void heap_destructor(void *arg) {
  heap_t *h = arg;
  if (!h || h == &mld_heap_empty) return;
  mld_tls_heap = &mld_heap_empty;        /* later frees in this thread take the remote path */
  mld_tls_exiting = true;                /* later mallocs use the exit heap: a new heap might never be abandoned */
  mld_heap_exit(h);
}

/* Lock order: the purging thread's creation (first: it allocates with that lock held), heaps (the exit heap, then
 * the list of heaps), purge, arena creation, arenas by index, huge cache, metadata, guarded pool (a leaf: its holder
 * takes no other allocator lock). Heaps before purge: a sweep holds the exit heap's lock while the pages it frees
 * notify the purging thread (bg_lock); purge before arenas: that thread holds bg_lock while it reads the arenas'
 * deadlines. Heaps before arena creation: the exit heap's first page may create arena 0. */
static void fork_prepare(void) {
  mld_purge_create_lock();
  mld_heaps_lock();
  mld_purge_fork_prepare();
  mld_arenas_fork_prepare();
  unsigned n = atomic_load(&mld_narenas);
  for (unsigned i = 0; i < n; i++) pthread_mutex_lock(&mld_arenas[i]->lock);
  mld_huge_fork_prepare();
  mld_meta_fork_prepare();
  mld_guard_fork_prepare();
}

static void fork_parent(void) {
  mld_guard_fork_parent();
  mld_meta_fork_parent();
  mld_huge_fork_parent();
  unsigned n = atomic_load(&mld_narenas);
  for (unsigned i = n; i-- > 0;) pthread_mutex_unlock(&mld_arenas[i]->lock);
  mld_arenas_fork_parent();
  mld_purge_fork_parent();
  mld_heaps_unlock();
  mld_purge_create_unlock();
}

static void fork_child(void) {
#ifdef MALLARD_SECURE
  mld_secure_fork_child();   /* first: the child's new pages, order and addresses owe nothing to the parent */
#endif
  mld_guard_fork_child();
  mld_meta_fork_child();
  mld_arenas_fork_child();
  mld_huge_fork_child();
  unsigned n = atomic_load(&mld_narenas);
  for (unsigned i = 0; i < n; i++) pthread_mutex_init(&mld_arenas[i]->lock, NULL);
  mld_heaps_fork_child();
  mld_purge_fork_child();
  mld_os_barrier_register();   /* one thread runs now: free here, for a kernel whose child does not inherit it */
}

#include "control/control.h"

/* Registered with the core (MLD_INIT_HOOK): every layer's mld_ensure_init lands here the first time. */
void mld_api_init(void) {
  if (atomic_load(&mld_initialized) == 1 && pthread_equal(init_thread, pthread_self())) return;   /* re-entered from init */
  pthread_mutex_lock(&init_lock);
  if (atomic_load(&mld_initialized) == 0) {
    init_thread = pthread_self();
    mld_start_ms = mld_now_ms();
    atomic_store(&mld_initialized, 1);
#ifdef MALLARD_SECURE
    mld_secure_init();
#endif
    mld_options_init();
    if (!mld_os_init()) mld_fatal("mallard: cannot reserve the ownership map\n");
    size_t n = mld_opt.narenas ? mld_opt.narenas : mld_ncpus();
    if (n > MLD_MAX_ARENAS) n = MLD_MAX_ARENAS;
    /* Without memory some arenas are missing: threads spread over those that exist, and the first heap
     * retries arena 0 (every call fails cleanly with ENOMEM until memory is back). */
    size_t made = 0;
    while (made < n && mld_arena_create() >= 0) made++;
    mld_auto_arenas = made ? (unsigned)made : 1;
    mld_purge_init();
    pthread_key_create(&mld_heap_key, heap_destructor);
    mld_live_init();   /* the options text a reader in another process shows: before it may see "ready" */
    atomic_store_explicit(&mld_initialized, 2, memory_order_release);
    /* These may allocate: the allocator is ready by now. */
    pthread_atfork(fork_prepare, fork_parent, fork_child);
    if (mld_opt.stats_print) {
      mld_stats_print_setup();
      atexit(mld_stats_print_at_exit);
    }
    if (mld_opt.verbose) mld_options_announce();
#ifdef MALLARD_SECURE
    if (mld_opt.verbose && mld_secure_weak_seed())
      mld_message("mallard-secure: getrandom failed; keys seeded from AT_RANDOM, the clock and addresses (weaker)\n");
#endif
  }
  pthread_mutex_unlock(&init_lock);
}

MLD_INIT_HOOK(mld_api_init);

__attribute__((constructor)) static void mld_constructor(void) { mld_ensure_init(); }
