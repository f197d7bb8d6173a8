/* Large blocks: log-uniform 64 KiB-32 MiB allocations touching every page, a few live per thread. */
#include "common.h"

struct obj {
  void *p;
  size_t n;
  uint64_t tag;
};

struct worker {
  long rounds, live;
  size_t max;
  uint64_t rng;
  struct obj *set;
};

static void *run(void *arg) {
  struct worker *w = arg;
  for (long j = 0; j < w->live; j++) w->set[j].p = NULL;
  for (long i = 0; i < w->rounds; i++) {
    struct obj *s = &w->set[rng_next(&w->rng) % (uint64_t)w->live];
    if (s->p) {
      pat_check(s->p, s->n, s->tag, "large");
      free(s->p);
    }
    s->n = rng_log(&w->rng, 64 * 1024, w->max);
    s->tag = rng_next(&w->rng);
    s->p = xmalloc(s->n);
    pat_fill(s->p, s->n, s->tag); /* writes 16 bytes of every 4 KiB page */
  }
  for (long j = 0; j < w->live; j++)
    if (w->set[j].p) {
      pat_check(w->set[j].p, w->set[j].n, w->set[j].tag, "large-final");
      free(w->set[j].p);
    }
  return NULL;
}

int main(int argc, char **argv) {
  /* -w is reused as the number of live blocks per thread. */
  struct bench_opts o = {.threads = 1, .iters = 400, .size = 32 << 20, .seed = 1, .wait_ms = 4};
  bench_parse(argc, argv, &o, "large: -t threads, -n allocations per thread, -s maximum bytes, -w live blocks per thread");
  struct worker *ws = calloc((size_t)o.threads, sizeof *ws);
  pthread_t *th = calloc((size_t)o.threads, sizeof *th);
  double t0 = now_s();
  for (int i = 0; i < o.threads; i++) {
    ws[i] = (struct worker){.rounds = o.iters, .live = o.wait_ms > 0 ? o.wait_ms : 1,
                            .max = o.size > 65536 ? (size_t)o.size : 65536, .rng = rng_seed(o.seed, (uint64_t)i)};
    ws[i].set = xmalloc((size_t)ws[i].live * sizeof(struct obj));
    xpthread_create(&th[i], run, &ws[i]);
  }
  for (int i = 0; i < o.threads; i++) pthread_join(th[i], NULL);
  double secs = now_s() - t0;
  for (int i = 0; i < o.threads; i++) free(ws[i].set);
  free(ws);
  free(th);
  bench_result("large", &o, o.iters * o.threads, secs, NULL);
  return 0;
}
