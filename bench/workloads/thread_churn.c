/* Thread churn: thousands of short-lived threads that allocate, free, and leave objects for the next thread to free. */
#include "common.h"

#define HANDOFF 32 /* objects each thread leaves behind for its successor in the same lane */

struct obj {
  void *p;
  size_t n;
  uint64_t tag;
};

struct lane {
  struct obj left[HANDOFF];   /* written by one generation, freed by the next (always joined in between) */
  uint64_t rng;
  long work;
};

static void *run(void *arg) {
  struct lane *l = arg;
  struct obj mine[64];
  for (int i = 0; i < HANDOFF; i++) {
    if (l->left[i].p) {
      pat_check(l->left[i].p, l->left[i].n, l->left[i].tag, "thread-churn-inherited");
      free(l->left[i].p);
    }
  }
  for (long r = 0; r < l->work; r++) {
    for (int i = 0; i < 64; i++) {
      mine[i].n = rng_range(&l->rng, 16, 1024);
      mine[i].tag = rng_next(&l->rng);
      mine[i].p = xmalloc(mine[i].n);
      pat_fill(mine[i].p, mine[i].n, mine[i].tag);
    }
    for (int i = 0; i < 64; i++) {
      pat_check(mine[i].p, mine[i].n, mine[i].tag, "thread-churn");
      free(mine[i].p);
    }
  }
  for (int i = 0; i < HANDOFF; i++) {
    struct obj *o = &l->left[i];
    o->n = rng_range(&l->rng, 16, 4096);
    o->tag = rng_next(&l->rng);
    o->p = xmalloc(o->n);
    pat_fill(o->p, o->n, o->tag);
  }
  return NULL;
}

int main(int argc, char **argv) {
  /* -s is the number of 64-object rounds each short-lived thread runs. */
  struct bench_opts o = {.threads = 2, .iters = 2000, .size = 4, .seed = 1};
  bench_parse(argc, argv, &o, "thread-churn: -t concurrent threads, -n threads created in all, -s rounds per thread");
  struct lane *lanes = calloc((size_t)o.threads, sizeof *lanes);
  pthread_t *th = calloc((size_t)o.threads, sizeof *th);
  for (int i = 0; i < o.threads; i++) {
    lanes[i].rng = rng_seed(o.seed, (uint64_t)i);
    lanes[i].work = o.size;
  }
  long created = 0;
  double t0 = now_s();
  while (created < o.iters) {
    int batch = 0;
    for (; batch < o.threads && created < o.iters; batch++, created++) xpthread_create(&th[batch], run, &lanes[batch]);
    for (int i = 0; i < batch; i++) pthread_join(th[i], NULL);
  }
  double secs = now_s() - t0;
  long rss_before_final = proc_status_kib("VmRSS");
  for (int i = 0; i < o.threads; i++)
    for (int j = 0; j < HANDOFF; j++)
      if (lanes[i].left[j].p) {
        pat_check(lanes[i].left[j].p, lanes[i].left[j].n, lanes[i].left[j].tag, "thread-churn-final");
        free(lanes[i].left[j].p);
      }
  free(lanes);
  free(th);
  bench_result("thread-churn", &o, created, secs, "\"threads_created\": %ld, \"rss_after_threads_kib\": %ld", created,
               rss_before_final);
  return 0;
}
