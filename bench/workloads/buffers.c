/* Medium buffers in bursts: each thread takes a burst of 1..w buffers of one 16-256 KiB size, writes and checks them, frees them all. */
#include "common.h"

struct obj {
  void *p;
  size_t n;
  uint64_t tag;
};

struct worker {
  long rounds, burst;
  size_t max;
  uint64_t rng;
  long ops;
};

/* One request's buffers (an I/O buffer pool's pattern): a burst of one size, used, then all given back in the order
 * they were taken, so a size class empties and fills its pages over and over. */
static void *run(void *arg) {
  struct worker *w = arg;
  struct obj *set = xmalloc((size_t)w->burst * sizeof *set);
  for (long i = 0; i < w->rounds; i++) {
    long k = (long)rng_range(&w->rng, 1, (size_t)w->burst);
    size_t n = rng_log(&w->rng, 16 * 1024, w->max);
    for (long j = 0; j < k; j++) {
      set[j].n = n;
      set[j].tag = rng_next(&w->rng);
      set[j].p = xmalloc(n);
      pat_fill(set[j].p, n, set[j].tag); /* writes 16 bytes of every 4 KiB page */
    }
    for (long j = 0; j < k; j++) {
      pat_check(set[j].p, set[j].n, set[j].tag, "buffers");
      free(set[j].p);
    }
    w->ops += k;
  }
  free(set);
  return NULL;
}

int main(int argc, char **argv) {
  /* -w is reused as the largest burst. */
  struct bench_opts o = {.threads = 1, .iters = 20000, .size = 256 * 1024, .seed = 1, .wait_ms = 16};
  bench_parse(argc, argv, &o, "buffers: -t threads, -n bursts per thread, -s largest buffer (bytes, at least 16 KiB), "
                              "-w largest burst");
  size_t max = o.size > 16 * 1024 ? (size_t)o.size : 16 * 1024;
  long burst = o.wait_ms > 0 ? o.wait_ms : 1;
  struct worker *ws = calloc((size_t)o.threads, sizeof *ws);
  pthread_t *th = calloc((size_t)o.threads, sizeof *th);
  if (!ws || !th) bench_die("buffers: out of memory");
  double t0 = now_s();
  for (int i = 0; i < o.threads; i++) {
    ws[i] = (struct worker){.rounds = o.iters, .burst = burst, .max = max, .rng = rng_seed(o.seed, (uint64_t)i)};
    xpthread_create(&th[i], run, &ws[i]);
  }
  long ops = 0;
  for (int i = 0; i < o.threads; i++) {
    pthread_join(th[i], NULL);
    ops += ws[i].ops;
  }
  double secs = now_s() - t0;
  free(ws);
  free(th);
  bench_result("buffers", &o, ops, secs, NULL);
  return 0;
}
