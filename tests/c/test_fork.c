/* test_fork.c — fork from a multi-threaded parent: the child allocates, frees, starts a thread and exits 0. */
#include "mtest.h"
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>

#define NWORKERS 4
#define NFORKS 60
#define INFLIGHT 4                    /* children running at once */

static _Atomic(bool) stop;
static _Atomic(uint64_t) worker_ops;

/* Workers allocate and free all the time, across sizes (small, medium, large, huge) and with remote frees. */
static void *worker(void *arg) {
  mt_rng_t r;
  mt_rng_seed(&r, (uintptr_t)arg);
  enum { N = 128 };
  void *b[N] = { 0 };
  size_t s[N] = { 0 };
  while (!atomic_load(&stop)) {
    unsigned k = (unsigned)mt_rng_below(&r, N);
    if (b[k]) {
      CHECK(((uint8_t *)b[k])[0] == (uint8_t)k && ((uint8_t *)b[k])[s[k] - 1] == (uint8_t)k, "worker block damaged");
      M_free(b[k]);
    }
    uint64_t x = mt_rng_below(&r, 1000);
    s[k] = x < 900 ? 1 + mt_rng_below(&r, 2000) : x < 990 ? 10000 + mt_rng_below(&r, 200000)
                                                          : 300000 + mt_rng_below(&r, 5000000);
    b[k] = M_malloc(s[k]);
    REQUIRE(b[k], "worker malloc(%zu)", s[k]);
    ((uint8_t *)b[k])[0] = (uint8_t)k;
    ((uint8_t *)b[k])[s[k] - 1] = (uint8_t)k;
    atomic_fetch_add(&worker_ops, 1);
  }
  for (unsigned k = 0; k < N; k++) M_free(b[k]);
  return NULL;
}

static void *child_thread(void *arg) {
  uint8_t **slot = arg;
  *slot = M_malloc(5000);
  if (*slot) memset(*slot, 0x3C, 5000);
  void *q = M_malloc(600 * 1024);
  M_free(q);
  return NULL;
}

/* In the child: only this thread survived the fork; the allocator must still work, with and without new threads. */
static int child(uint8_t *parent_block, size_t parent_size) {
  alarm(20);   /* a deadlock in the child shows as SIGALRM in the parent, not as a hung test */
  for (size_t i = 0; i < parent_size; i++)
    if (parent_block[i] != (uint8_t)(i * 13)) return 3;   /* the parent's data is inherited intact */
  M_free(parent_block);
  void *b[256];
  for (int i = 0; i < 256; i++) {
    size_t n = (size_t)i * 97 + (i % 128 == 0 ? 3u << 20 : 0);
    b[i] = M_malloc(n);
    if (!b[i]) return 4;
    memset(b[i], i, n);
  }
  for (int i = 0; i < 256; i++) M_free(b[i]);
  uint8_t *from_thread = NULL;
  pthread_t t;
  if (pthread_create(&t, NULL, child_thread, &from_thread) != 0) return 5;
  pthread_join(t, NULL);
  if (!from_thread || from_thread[4999] != 0x3C) return 6;
  M_free(from_thread);   /* a block of the exited thread: its page was abandoned */
  void *z = M_calloc(100, 100);
  if (!z || ((uint8_t *)z)[9999]) return 7;
  M_free(z);
  return 0;
}

int main(void) {
  double t0 = mt_now();
  pthread_t w[NWORKERS];
  for (uintptr_t i = 0; i < NWORKERS; i++) REQUIRE(!pthread_create(&w[i], NULL, worker, (void *)(i + 1)), "create");
  /* Fork only once every worker is running its loop: a thread still starting up may hold the C library's (or a
   * sanitizer runtime's) own thread-creation locks, which are not ours to make fork-safe. */
  while (atomic_load(&worker_ops) < 100 * NWORKERS) sched_yield();
  int ok = 0, bad = 0;
  for (int f = 0; f < NFORKS && bad <= 5; f += INFLIGHT) {
    pid_t pids[INFLIGHT];
    for (int k = 0; k < INFLIGHT; k++) {
      size_t psize = 100 + (size_t)(f + k) * 37;
      uint8_t *pb = M_malloc(psize);
      REQUIRE(pb, "malloc");
      for (size_t i = 0; i < psize; i++) pb[i] = (uint8_t)(i * 13);
      pids[k] = fork();
      REQUIRE(pids[k] >= 0, "fork: %s", strerror(errno));
      if (pids[k] == 0) _exit(child(pb, psize));
      M_free(pb);
    }
    for (int k = 0; k < INFLIGHT; k++) {
      int st;
      REQUIRE(waitpid(pids[k], &st, 0) == pids[k], "waitpid");
      if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
        ok++;
      } else {
        bad++;
        CHECK(0, "fork %d: child %s %d", f + k, WIFEXITED(st) ? "exited with" : "killed by signal",
              WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
      }
    }
  }
  atomic_store(&stop, true);
  for (int i = 0; i < NWORKERS; i++) pthread_join(w[i], NULL);
  printf("%d forks: %d children exited 0, %d failed; workers did %llu operations meanwhile; %.2f s\n", NFORKS, ok, bad,
         (unsigned long long)atomic_load(&worker_ops), mt_now() - t0);
  CHECK(atomic_load(&worker_ops) > 0, "workers never ran");
  return mt_result("test_fork (" MT_MODE ")");
}
