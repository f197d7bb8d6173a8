/* test_fork_heaps.c — in a fork child, the parent's other threads' heaps leave the registry (issue 36, suspicion on
 * fork): another thread's heap whose lock is held at the fork (its owner in a slow path) must not make every sweep
 * in the child ask for another (the purging thread would then wake every decay period for ever). White-box: the lock is taken by this test. */
#include "mtest.h"
#include "core/core.h"
#include <pthread.h>
#include <sys/wait.h>

static heap_t *other;
static _Atomic(int) state;   /* 1: the other thread has its heap; 2: it may exit */

static void *thread_main(void *arg) {
  (void)arg;
  void *p = M_malloc(100);   /* a heap of its own, with one live block */
  REQUIRE(p, "malloc");
  other = mld_tls_heap;
  atomic_store(&state, 1);
  while (atomic_load(&state) != 2) sched_yield();
  M_free(p);
  return NULL;
}

int main(void) {
  M_free(M_malloc(16));
  pthread_t t;
  REQUIRE(!pthread_create(&t, NULL, thread_main, NULL), "create");
  while (atomic_load(&state) != 1) sched_yield();
  mld_spin_lock(&other->lock);   /* as if its owner were in a slow path when the fork happens */
  pid_t pid = fork();
  REQUIRE(pid >= 0, "fork");
  if (pid == 0) {
    int bad = 0;
    atomic_store(&mld_sweep_since, 0);
    mld_heaps_sweep(true);   /* what malloc_trim and the purging thread run */
    if (atomic_load(&mld_sweep_since) != 0) {
      fprintf(stderr, "child: a sweep met the other thread's held heap lock and asked for another sweep\n");
      bad = 1;
    }
    for (heap_t *h = mld_heaps_all; h; h = h->next_all)
      if (h == other) { fprintf(stderr, "child: the other thread's heap is still registered\n"); bad = 1; }
    _exit(bad);
  }
  mld_spin_unlock(&other->lock);
  int st;
  REQUIRE(waitpid(pid, &st, 0) == pid, "waitpid");
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child failed (status %#x)", st);
  atomic_store(&state, 2);
  pthread_join(t, NULL);
  return mt_result("test_fork_heaps");
}
