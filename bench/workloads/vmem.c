/* Per-thread VIRT test: N threads that each call malloc(8) once; VmSize, VmRSS and VmData growth per thread. */
#include "common.h"

static pthread_barrier_t started, go, allocated, release;

struct worker {
  void *p;
  uint64_t tag;
};

static void *run(void *arg) {
  struct worker *w = arg;
  pthread_barrier_wait(&started); /* main measures the threads' stacks alone, then lets them go */
  pthread_barrier_wait(&go);
  w->p = xmalloc(8);
  pat_fill(w->p, 8, w->tag);
  pthread_barrier_wait(&allocated); /* main measures again: the growth is the allocator's per-thread cost */
  pthread_barrier_wait(&release);
  pat_check(w->p, 8, w->tag, "vmem");
  free(w->p);
  return NULL;
}

struct snap {
  long size, rss, data;
};
static struct snap snap(void) {
  return (struct snap){proc_status_kib("VmSize"), proc_status_kib("VmRSS"), proc_status_kib("VmData")};
}

int main(int argc, char **argv) {
  struct bench_opts o = {.threads = 10, .iters = 1, .size = 8, .seed = 1};
  bench_parse(argc, argv, &o, "vmem: -t threads, each calls malloc(8) once");
  int n = o.threads;
  struct worker *ws = calloc((size_t)n, sizeof *ws);
  pthread_t *th = calloc((size_t)n, sizeof *th);
  uint64_t rng = rng_seed(o.seed, 0);
  /* Warm the main thread's heap so that its own first-use cost is not counted. */
  free(xmalloc(8));
  pthread_barrier_init(&started, NULL, (unsigned)n + 1);
  pthread_barrier_init(&go, NULL, (unsigned)n + 1);
  pthread_barrier_init(&allocated, NULL, (unsigned)n + 1);
  pthread_barrier_init(&release, NULL, (unsigned)n + 1);
  struct snap s0 = snap();
  double t0 = now_s();
  for (int i = 0; i < n; i++) {
    ws[i].tag = rng_next(&rng);
    xpthread_create(&th[i], run, &ws[i]);
  }
  pthread_barrier_wait(&started);
  struct snap s1 = snap();
  pthread_barrier_wait(&go);
  pthread_barrier_wait(&allocated);
  struct snap s2 = snap();
  pthread_barrier_wait(&release);
  for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
  double secs = now_s() - t0;
  free(ws);
  free(th);
  bench_result("vmem", &o, n, secs,
               "\"vmsize_base_kib\": %ld, \"vmsize_threads_kib\": %ld, \"vmsize_malloc_kib\": %ld, "
               "\"vmrss_base_kib\": %ld, \"vmrss_threads_kib\": %ld, \"vmrss_malloc_kib\": %ld, "
               "\"vmdata_base_kib\": %ld, \"vmdata_threads_kib\": %ld, \"vmdata_malloc_kib\": %ld, "
               "\"virt_per_thread_kib\": %.1f, \"virt_alloc_per_thread_kib\": %.1f, \"rss_alloc_per_thread_kib\": %.1f, "
               "\"data_alloc_per_thread_kib\": %.1f",
               s0.size, s1.size, s2.size, s0.rss, s1.rss, s2.rss, s0.data, s1.data, s2.data,
               (double)(s2.size - s0.size) / n, (double)(s2.size - s1.size) / n, (double)(s2.rss - s1.rss) / n,
               (double)(s2.data - s1.data) / n);
  return 0;
}
