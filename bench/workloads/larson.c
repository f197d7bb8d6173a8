/* Larson-style server simulation: threads replace random 16-1000 B objects, then hand their arrays to new threads. */
#include "common.h"

/* One slot of a working array: the object, its size and the tag its pattern was written with. */
struct slot {
  void *p;
  size_t n;
  uint64_t tag;
};

struct worker {
  struct slot *slots;   /* handed from generation to generation: objects die in other threads */
  long nslots, rounds, gens_left;
  uint64_t rng;
  long ops;
  int id;
};

static void *run(void *arg) {
  struct worker *w = arg;
  for (long i = 0; i < w->rounds; i++) {
    struct slot *s = &w->slots[rng_next(&w->rng) % (uint64_t)w->nslots];
    pat_check(s->p, s->n, s->tag, "larson");
    free(s->p);
    s->n = rng_range(&w->rng, 16, 1000);
    s->tag = rng_next(&w->rng);
    s->p = xmalloc(s->n);
    pat_fill(s->p, s->n, s->tag);
  }
  w->ops += w->rounds;
  if (--w->gens_left > 0) {
    /* The array (and every object in it) moves to a fresh thread, as a server hands a connection over. */
    pthread_t t;
    xpthread_create(&t, run, w);
    pthread_join(t, NULL);
  }
  return NULL;
}

int main(int argc, char **argv) {
  /* -w is reused as the number of generations (thread hand-overs) per worker. */
  struct bench_opts o = {.threads = 2, .iters = 20000, .size = 1000, .seed = 1, .wait_ms = 10};
  bench_parse(argc, argv, &o, "larson: -t threads, -n replacements per generation, -s slots per thread, -w generations");
  long gens = o.wait_ms ? o.wait_ms : 1;
  struct worker *ws = calloc((size_t)o.threads, sizeof *ws);
  for (int i = 0; i < o.threads; i++) {
    struct worker *w = &ws[i];
    w->id = i;
    w->nslots = o.size > 0 ? o.size : 1;
    w->rounds = o.iters;
    w->gens_left = gens;
    w->rng = rng_seed(o.seed, (uint64_t)i);
    w->slots = xmalloc((size_t)w->nslots * sizeof *w->slots);
    /* The main thread fills the arrays, so the first generation already frees remote objects. */
    for (long j = 0; j < w->nslots; j++) {
      w->slots[j].n = rng_range(&w->rng, 16, 1000);
      w->slots[j].tag = rng_next(&w->rng);
      w->slots[j].p = xmalloc(w->slots[j].n);
      pat_fill(w->slots[j].p, w->slots[j].n, w->slots[j].tag);
    }
  }
  double t0 = now_s();
  pthread_t *th = calloc((size_t)o.threads, sizeof *th);
  for (int i = 0; i < o.threads; i++) xpthread_create(&th[i], run, &ws[i]);
  long ops = 0;
  for (int i = 0; i < o.threads; i++) {
    pthread_join(th[i], NULL);
    ops += ws[i].ops;
  }
  double secs = now_s() - t0;
  long peak = proc_status_kib("VmHWM");
  for (int i = 0; i < o.threads; i++) {
    for (long j = 0; j < ws[i].nslots; j++) {
      pat_check(ws[i].slots[j].p, ws[i].slots[j].n, ws[i].slots[j].tag, "larson-final");
      free(ws[i].slots[j].p);
    }
    free(ws[i].slots);
  }
  free(ws);
  free(th);
  bench_result("larson", &o, ops, secs, "\"generations\": %ld, \"hwm_run_kib\": %ld", gens, peak);
  return 0;
}
