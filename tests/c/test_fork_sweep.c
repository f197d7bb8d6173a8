/* test_fork_sweep.c — the fork handlers take the exit heap's lock before the purging thread's (a sweep's order). */
/* A sweep holds the exit heap's lock while the pages it gives back notify the purging thread, which takes bg_lock
 * when that thread is idle. The fork handlers once took bg_lock first and the exit heap's lock after it: a fork
 * meeting such a sweep deadlocked (4 of 16 race-delay model runs hung when run 16 at once). Here the meeting is made
 * deterministic: this thread holds the exit heap's lock, another thread forks (its handlers wait for that lock), and
 * then this thread notifies the idle purging thread, as the sweep does. A watchdog fails the test if that
 * notification never returns. */
#include "mtest.h"
#include "core/core.h"
#include "control/control.h"
#include <pthread.h>
#include <sys/wait.h>

#define WATCHDOG_S 15

static _Atomic(int) done;

/* No allocation here: it must run while the allocator's threads are stuck. */
static void *watchdog(void *arg) {
  (void)arg;
  for (int s = 0; s < WATCHDOG_S * 10 && !atomic_load(&done); s++) usleep(100000);
  if (!atomic_load(&done)) {
    static const char msg[] = "FAIL test_fork_sweep: a notification under the exit heap's lock never returned "
                              "while another thread forked: the fork handlers' lock order deadlocks\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    _exit(1);
  }
  return NULL;
}

static void *forker(void *arg) {
  (void)arg;
  pid_t pid = fork();
  if (pid == 0) _exit(0);
  REQUIRE(pid > 0, "fork: %s", strerror(errno));
  int st = 0;
  REQUIRE(waitpid(pid, &st, 0) == pid, "waitpid: %s", strerror(errno));
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "forked child status 0x%x", st);
  return NULL;
}

int main(void) {
  /* The purging thread: started once enough is mapped, then idle once nothing dirty is left. */
  void *big = malloc(16 << 20);
  REQUIRE(big, "malloc(16 MiB)");
  memset(big, 1, 16 << 20);
  free(big);
  for (int i = 0; i < 8; i++) free(malloc(1000));   /* allocation slow paths start the thread */
  for (int i = 0; i < 200 && !mld_purge_thread_running(); i++) {
    free(malloc(100000));
    usleep(10000);
  }
  REQUIRE(mld_purge_thread_running(), "the purging thread did not start: the test cannot tell");
  mallard_collect(true);
  usleep(300000);   /* nothing dirty: the thread waits, idle */

  pthread_t d, f;
  REQUIRE(!pthread_create(&d, NULL, watchdog, NULL), "create");
  mld_exit_heap_lock();                    /* as a sweep of the exit heap does */
  REQUIRE(!pthread_create(&f, NULL, forker, NULL), "create");
  usleep(200000);                          /* the forker's handlers are now waiting for the exit heap's lock */
  mld_dirty_notify();                      /* the page the sweep gave back: takes bg_lock (the thread is idle) */
  mld_exit_heap_unlock();
  pthread_join(f, NULL);
  atomic_store(&done, 1);
  pthread_join(d, NULL);
  return mt_result("test_fork_sweep");
}
