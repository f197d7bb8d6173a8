/* Mixed sizes: each thread keeps a working set of log-uniform 16 B-256 KiB objects and replaces random ones. */
#include "common.h"

struct obj {
  void *p;
  size_t n;
  uint64_t tag;
};

struct worker {
  struct obj *set;
  long nset, rounds;
  uint64_t rng;
};

static void *run(void *arg) {
  struct worker *w = arg;
  for (long j = 0; j < w->nset; j++) {
    struct obj *s = &w->set[j];
    s->n = rng_log(&w->rng, 16, 256 * 1024);
    s->tag = rng_next(&w->rng);
    s->p = xmalloc(s->n);
    pat_fill(s->p, s->n, s->tag);
  }
  for (long i = 0; i < w->rounds; i++) {
    struct obj *s = &w->set[rng_next(&w->rng) % (uint64_t)w->nset];
    pat_check(s->p, s->n, s->tag, "mixed");
    free(s->p);
    s->n = rng_log(&w->rng, 16, 256 * 1024);
    s->tag = rng_next(&w->rng);
    s->p = xmalloc(s->n);
    pat_fill(s->p, s->n, s->tag);
  }
  for (long j = 0; j < w->nset; j++) {
    pat_check(w->set[j].p, w->set[j].n, w->set[j].tag, "mixed-final");
    free(w->set[j].p);
  }
  return NULL;
}

int main(int argc, char **argv) {
  struct bench_opts o = {.threads = 1, .iters = 200000, .size = 2000, .seed = 1};
  bench_parse(argc, argv, &o, "mixed: -t threads, -n replacements per thread, -s working-set objects per thread");
  struct worker *ws = calloc((size_t)o.threads, sizeof *ws);
  pthread_t *th = calloc((size_t)o.threads, sizeof *th);
  double t0 = now_s();
  for (int i = 0; i < o.threads; i++) {
    ws[i].nset = o.size > 0 ? o.size : 1;
    ws[i].rounds = o.iters;
    ws[i].rng = rng_seed(o.seed, (uint64_t)i);
    ws[i].set = xmalloc((size_t)ws[i].nset * sizeof(struct obj));
    xpthread_create(&th[i], run, &ws[i]);
  }
  for (int i = 0; i < o.threads; i++) pthread_join(th[i], NULL);
  double secs = now_s() - t0;
  for (int i = 0; i < o.threads; i++) free(ws[i].set);
  free(ws);
  free(th);
  bench_result("mixed", &o, o.iters * o.threads, secs, NULL);
  return 0;
}
