/* test_fork_purge.c — a fork child of a threaded parent stays single-threaded: its allocations start no purging
 * thread until the program starts a thread there itself (then they may). */
#include "mtest.h"
#include <pthread.h>
#include <sched.h>
#include <sys/wait.h>

static _Atomic(bool) stop;
static _Atomic(int) running;

static void *worker(void *arg) {   /* the parent is threaded: a thread that allocates, as a service's workers do */
  (void)arg;
  atomic_fetch_add(&running, 1);
  while (!atomic_load(&stop)) M_free(M_malloc(1000));
  return NULL;
}

static bool purge_running(void) {
  bool on = false;
  size_t len = sizeof on;
  REQUIRE(MT_CTL("background_thread", &on, &len, NULL, 0) == 0, "mallard_ctl(background_thread)");
  return on;
}

/* 64 blocks of 256 KiB, freed: slow paths over 8 MiB mapped, the amount that starts the purging thread. */
static void allocate_much(void) {
  void *p[64];
  for (int i = 0; i < 64; i++) {
    p[i] = M_malloc(256 << 10);
    REQUIRE(p[i], "malloc");
    memset(p[i], i, 256 << 10);
  }
  for (int i = 0; i < 64; i++) M_free(p[i]);
}

static void *child_thread(void *arg) { (void)arg; M_free(M_malloc(100)); return NULL; }

static int child(void) {
  alarm(20);
  long threads = mt_status_kb("Threads:");   /* 1 natively; qemu-user counts its own threads too */
  allocate_much();
  if (purge_running() || mt_status_kb("Threads:") != threads) {
    fprintf(stderr, "child: its allocations started a thread (Threads: %ld, then %ld; purging thread %d)\n", threads,
            mt_status_kb("Threads:"), purge_running());
    return 1;
  }
  pthread_t t;   /* the program starts a thread of its own: from then on the purging thread may start */
  if (pthread_create(&t, NULL, child_thread, NULL) != 0) return 2;
  pthread_join(t, NULL);
  allocate_much();
  if (!purge_running()) {
    fprintf(stderr, "child: no purging thread after the child's own thread allocated\n");
    return 3;
  }
  return 0;
}

int main(void) {
  allocate_much();
  CHECK(purge_running(), "the parent has no purging thread after allocating 16 MiB");
  pthread_t w;
  REQUIRE(!pthread_create(&w, NULL, worker, NULL), "create");
  while (!atomic_load(&running)) sched_yield();
  pid_t pid = fork();
  REQUIRE(pid >= 0, "fork");
  if (pid == 0) _exit(child());
  int st;
  REQUIRE(waitpid(pid, &st, 0) == pid, "waitpid");
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child failed (status %#x)", st);
  atomic_store(&stop, true);
  pthread_join(w, NULL);
  return mt_result("test_fork_purge (" MT_MODE ")");
}
