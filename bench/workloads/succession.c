/* Thread succession: each lane's thread replaces random 16-1000 B objects, then starts its successor, hands it every live object and exits. */
#include "common.h"

/* One slot of a lane's working set: the object, its size and the tag its pattern was written with. */
struct slot {
  void *p;
  size_t n;
  uint64_t tag;
};

/* A lane: a chain of threads, one at a time after the first, each handed the whole working set of the one before. */
struct lane {
  struct slot *slots;
  long nslots, rounds, gens;
  uint64_t rng;
  pthread_t *chain;   /* chain[g]: generation g's thread, written by generation g - 1 before it exits */
  long gen;           /* the generation running */
};

/* A light stamp, as larson touches its blocks: the tag in the first word, its low byte in the last byte. The work
 * between allocator calls stays small, so the allocator's share of the time (what this measures) stays large. */
static void stamp(const struct slot *s) {
  memcpy(s->p, &s->tag, sizeof s->tag);
  ((unsigned char *)s->p)[s->n - 1] = (unsigned char)s->tag;
  /* -c N: flip the last byte of the Nth object stamped, which the check before its free must catch. */
  if (bench_corrupt_at && atomic_fetch_add(&bench_fill_count, 1) + 1 == bench_corrupt_at) ((unsigned char *)s->p)[s->n - 1] ^= 0x5a;
}
static void check(const struct slot *s, const char *where) {
  uint64_t t;
  memcpy(&t, s->p, sizeof t);
  if (t != s->tag || ((unsigned char *)s->p)[s->n - 1] != (unsigned char)s->tag)
    bench_die("%s: block %p of %zu bytes damaged", where, s->p, s->n);
}

static void *run(void *arg) {
  struct lane *l = arg;
  for (long i = 0; i < l->rounds; i++) {
    struct slot *s = &l->slots[rng_next(&l->rng) % (uint64_t)l->nslots];
    check(s, "succession");
    free(s->p);   /* after the first rounds: mostly blocks a thread that has exited allocated */
    s->n = rng_range(&l->rng, 16, 1000);
    s->tag = rng_next(&l->rng);
    s->p = xmalloc(s->n);
    stamp(s);
  }
  /* The successor starts before this thread ends, as larson's threads do: the two overlap only while this one exits.
   * Nothing of the lane is touched after the create (the successor owns it); main joins the chain in order. */
  if (++l->gen < l->gens) xpthread_create(&l->chain[l->gen], run, l);
  return NULL;
}

int main(int argc, char **argv) {
  struct bench_opts o = {.threads = 2, .iters = 100000, .size = 1000, .seed = 1, .wait_ms = 20};
  bench_parse(argc, argv, &o, "succession: -t lanes (threads at a time), -n replacements per thread, "
                              "-s objects per lane, -w threads per lane (generations)");
  long gens = o.wait_ms > 0 ? o.wait_ms : 1;
  struct lane *lanes = calloc((size_t)o.threads, sizeof *lanes);
  if (!lanes) bench_die("out of memory");
  for (int i = 0; i < o.threads; i++) {
    struct lane *l = &lanes[i];
    l->nslots = o.size > 0 ? o.size : 1;
    l->rounds = o.iters;
    l->gens = gens;
    l->rng = rng_seed(o.seed, (uint64_t)i);
    l->chain = calloc((size_t)gens, sizeof *l->chain);
    l->slots = xmalloc((size_t)l->nslots * sizeof *l->slots);
    if (!l->chain) bench_die("out of memory");
    /* Filled by the main thread: the first generation already frees blocks of another thread. */
    for (long j = 0; j < l->nslots; j++) {
      l->slots[j].n = rng_range(&l->rng, 16, 1000);
      l->slots[j].tag = rng_next(&l->rng);
      l->slots[j].p = xmalloc(l->slots[j].n);
      stamp(&l->slots[j]);
    }
  }
  double t0 = now_s();
  for (int i = 0; i < o.threads; i++) xpthread_create(&lanes[i].chain[0], run, &lanes[i]);
  /* chain[g + 1] is written by thread g before it ends: readable once g is joined. */
  for (int i = 0; i < o.threads; i++)
    for (long g = 0; g < gens; g++) pthread_join(lanes[i].chain[g], NULL);
  double secs = now_s() - t0;
  long peak = proc_status_kib("VmHWM");
  long ops = 0;
  for (int i = 0; i < o.threads; i++) {
    struct lane *l = &lanes[i];
    ops += l->rounds * l->gens;
    for (long j = 0; j < l->nslots; j++) {
      check(&l->slots[j], "succession-final");
      free(l->slots[j].p);
    }
    free(l->slots);
    free(l->chain);
  }
  free(lanes);
  bench_result("succession", &o, ops, secs, "\"generations\": %ld, \"hwm_run_kib\": %ld", gens, peak);
  return 0;
}
