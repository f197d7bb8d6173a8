/* test_fork_purge_start.c — a fork while another thread starts the purging thread never deadlocks in fork(). */
/* The fork handlers take the purging thread's creation lock and, if the thread is marked started, wait until it
 * runs. A creator that marked it started before taking that lock left the handler waiting for a thread not yet
 * created, and itself waiting for the lock (found as a hang of guard_stress under qemu-user). Each round is a fresh
 * process in which one thread's large allocations start the purging thread while the main thread forks
 * (children that exit at once) until it has started; an alarm turns a hang into a failure. The
 * race-delay build pauses where a fork may come between the creator's checks and its lock. */
#include "mtest.h"
#include "core/core.h"
#include "control/control.h"
#include <signal.h>
#include <unistd.h>

enum { ROUNDS = 40, HANG_S = 20, START_S = 10 };   /* START_S < HANG_S: a failed start is told from a hang */

static _Atomic(bool) allocated;

static void *starter(void *arg) {
  (void)arg;
  /* A new heap (the child may start the thread again), enough mapped to start it; a call that met a fork in
   * progress leaves the start to a later one. Tried for a time, not a count: under qemu-user the main thread's
   * forks keep the start suspended most of the time, and 1,000 quick tries once all fell inside them (CI). */
  for (double t0 = mt_now(); !mld_purge_thread_running() && mt_now() - t0 < START_S;) {
    void *big = M_malloc(16 << 20);
    REQUIRE(big, "malloc(16 MiB)");
    M_free(big);
    usleep(50);   /* lets a fork finish between tries */
  }
  atomic_store(&allocated, true);
  return NULL;
}

static int one_round(void) {   /* in a fresh child: 0 when every fork returned and the purging thread started */
  alarm(HANG_S);                /* default action: the round's process dies of SIGALRM */
  pthread_t t;
  if (pthread_create(&t, NULL, starter, NULL)) return 3;
  int forks = 0;
  while (!atomic_load(&allocated) || forks == 0) {
    pid_t pid = fork();
    if (pid == 0) _exit(0);
    if (pid < 0) return 4;
    int st = 0;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st)) return 5;
    forks++;
  }
  pthread_join(t, NULL);
  return mld_purge_thread_running() ? 0 : 6;
}

int main(void) {
  M_free(M_malloc(16));   /* initialised (prefix mode: at the first call), little mapped: no purging thread here */
  REQUIRE(!mld_purge_thread_running(), "the purging thread runs already: the test cannot tell");
  for (int r = 0; r < ROUNDS; r++) {
    pid_t pid = fork();
    REQUIRE(pid >= 0, "fork");
    if (pid == 0) _exit(one_round());
    int st = 0;
    REQUIRE(waitpid(pid, &st, 0) == pid, "waitpid");
    if (WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM) {
      CHECK(0, "round %d: still running after %d s (a fork waited for a purging thread never created)", r, HANG_S);
      break;
    }
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "round %d: status %d (exit 6: the purging thread never started)", r, st);
  }
  return mt_result("fork_purge_start");
}
