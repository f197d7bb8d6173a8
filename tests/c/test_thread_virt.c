/* test_thread_virt.c — a thread that calls malloc(8) once grows VmSize by at most 2 MiB beyond its own stack. */
#include "mtest.h"
#include <pthread.h>

#define NTHREADS 48
#define STACK_KB 256L
#define GUARD_KB 4L
#define LIMIT_KB 2048L                /* per thread, beyond its stack and guard page */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static int ready;                     /* threads that have done their malloc */
static bool release;                  /* main lets them exit */

static void *worker(void *arg) {
  (void)arg;
  void *p = M_malloc(8);
  REQUIRE(p, "malloc(8)");
  CHECK(MT_OWNS(p), "thread's malloc is not Mallard's");
  pthread_mutex_lock(&lock);
  ready++;
  pthread_cond_broadcast(&cond);
  while (!release) pthread_cond_wait(&cond, &lock);   /* stay alive: every thread's cost is counted at once */
  pthread_mutex_unlock(&lock);
  M_free(p);
  return NULL;
}

int main(void) {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, (size_t)STACK_KB * 1024);
  pthread_attr_setguardsize(&attr, (size_t)GUARD_KB * 1024);
  M_free(M_malloc(8));   /* the main thread's own heap exists before we measure */
  pthread_t t[NTHREADS];
  long worst = 0, total = 0, vm_first = mt_status_kb("VmSize:");
  REQUIRE(vm_first > 0, "cannot read VmSize");
  for (int i = 0; i < NTHREADS; i++) {
    long before = mt_status_kb("VmSize:");
    REQUIRE(!pthread_create(&t[i], &attr, worker, NULL), "pthread_create");
    pthread_mutex_lock(&lock);
    while (ready < i + 1) pthread_cond_wait(&cond, &lock);
    pthread_mutex_unlock(&lock);
    long grown = mt_status_kb("VmSize:") - before - STACK_KB - GUARD_KB;
    if (grown > worst) worst = grown;
    total += grown;
    printf("thread %2d: VmSize +%ld KiB beyond its stack\n", i, grown);
  }
  long all = mt_status_kb("VmSize:") - vm_first - NTHREADS * (STACK_KB + GUARD_KB);
  printf("%d threads: %ld KiB beyond their stacks in all (%.0f KiB each), worst single thread %ld KiB\n", NTHREADS,
         all, (double)all / NTHREADS, worst);
  /* Every thread, the first on a fresh arena included, stays within 2 MiB beyond its stack. */
  CHECK(worst <= LIMIT_KB, "a thread calling malloc(8) once grew VmSize by %ld KiB beyond its stack (limit %ld)",
        worst, LIMIT_KB);
  CHECK(all <= NTHREADS * LIMIT_KB / 4, "on average %ld KiB per thread (want well under the limit)", all / NTHREADS);
  pthread_mutex_lock(&lock);
  release = true;
  pthread_cond_broadcast(&cond);
  pthread_mutex_unlock(&lock);
  for (int i = 0; i < NTHREADS; i++) pthread_join(t[i], NULL);
  (void)total;
  return mt_result("test_thread_virt (" MT_MODE ")");
}
