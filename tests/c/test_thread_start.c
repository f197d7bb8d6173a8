/* test_thread_start.c — Mallard's own threads and fork: the membarrier registration is made while one thread runs. */
/* (1) At initialisation, and again in a fork child, the process registers for membarrier's private expedited
 * barrier (registered with several threads running, the kernel waits for an RCU grace period: ~9 ms in the thread
 * that asked): a raw barrier call succeeds at once instead of failing with EPERM (in the child, on kernels that let
 * it inherit the parent's registration, whether or not the child registers again). (2) The purging thread's creator
 * does not wait for it to run; a fork right after its creation does (under qemu-user a fork at that moment leaves
 * qemu's clone lock held in the child): with every CPU kept busy, so the new thread waits to be scheduled, the
 * parent finds it running when fork returns, and the child allocates and exits. */
#include "mtest.h"
#include "core/core.h"
#include "control/control.h"
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define BARRIER_QUERY 0
#define BARRIER_PRIVATE_EXPEDITED (1 << 3)

static bool offered;   /* the kernel (or qemu) offers the private expedited barrier */

static int barrier_errno(void) {   /* 0: the barrier ran, so the process was registered; else errno */
  return syscall(SYS_membarrier, BARRIER_PRIVATE_EXPEDITED, 0, 0) == 0 ? 0 : errno;
}

static _Atomic(bool) spin_stop;
static void *spinner(void *arg) {
  (void)arg;
  while (!atomic_load_explicit(&spin_stop, memory_order_relaxed)) {}
  return NULL;
}

int main(void) {
  M_free(M_malloc(16));   /* initialised (prefix mode: at the first call) */
  long q = syscall(SYS_membarrier, BARRIER_QUERY, 0, 0);
  offered = q >= 0 && (q & BARRIER_PRIVATE_EXPEDITED);
  if (!offered) printf("membarrier's private expedited barrier is not offered here: no registration to check\n");
  else CHECK(barrier_errno() == 0, "not registered at initialisation (errno %d)", barrier_errno());

  /* One CPU for this thread and every thread made from now on (the purging thread inherits it), kept busy: the new
   * thread waits behind its creator and the spinners. */
  cpu_set_t set;
  REQUIRE(!sched_getaffinity(0, sizeof set, &set), "sched_getaffinity");
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &set)) {
      CPU_ZERO(&set);
      CPU_SET(c, &set);
      break;
    }
  REQUIRE(!sched_setaffinity(0, sizeof set, &set), "sched_setaffinity");
  enum { SPINNERS = 2 };
  int nspin = SPINNERS;
  pthread_t sp[SPINNERS];
  for (int i = 0; i < nspin; i++) REQUIRE(!pthread_create(&sp[i], NULL, spinner, NULL), "pthread_create");
  REQUIRE(!mld_purge_thread_running(), "the purging thread runs already: the test cannot tell");
  void *big = M_malloc(16 << 20);   /* enough mapped: this call's slow path starts the purging thread */
  REQUIRE(big, "malloc(16 MiB)");
  pid_t pid = fork();   /* at once: the new thread is most likely still waiting for a CPU */
  if (pid == 0) {
    int e = offered ? barrier_errno() : 0;
    void *p = M_malloc(1000);
    M_free(p);
    _exit(e == 0 && p ? 0 : 10 + (e & 0x3f));
  }
  REQUIRE(pid > 0, "fork");
  bool running = mld_purge_thread_running(), booted = mld_purge_thread_booted();
  atomic_store(&spin_stop, true);
  for (int i = 0; i < nspin; i++) pthread_join(sp[i], NULL);
  REQUIRE(running, "the purging thread did not start: the test cannot tell");
  CHECK(booted, "fork returned before the purging thread created just before it ran");
  int st = 0;
  REQUIRE(waitpid(pid, &st, 0) == pid, "waitpid");
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child: status %d (10 + errno: not registered in the child)", st);
  M_free(big);
  return mt_result("thread_start");
}
