/* Fast-path microbenchmark: nanoseconds per malloc/free pair of cached sizes in a tight loop, per remote free, and
 * per replacement of a random one of 5,000 live 8-1000 B blocks (larson's loop, one thread). */
#include "common.h"

#define BATCH 256 /* objects handed from the allocating thread to the freeing thread at a time */

/* Keeps the compiler from pairing malloc with free and deleting both. */
#define KEEP(p) __asm__ volatile("" : : "r"(p) : "memory")

static double pairs(size_t n, long iters) {
  /* Warm up: the size class gets a cached page before timing. */
  for (int i = 0; i < 1000; i++) {
    void *p = malloc(n);
    KEEP(p);
    free(p);
  }
  double t0 = now_s();
  for (long i = 0; i < iters; i++) {
    unsigned char *p = malloc(n);
    KEEP(p);
    p[0] = (unsigned char)i; /* one store, as a real caller would make */
    free(p);
  }
  return (now_s() - t0) * 1e9 / (double)iters;
}

/* Single-slot handover between the two threads of the remote-free test: full is set by the allocator, cleared by the freer. */
static void *_Atomic slot;
static atomic_int stop;
static double remote_free_ns;

struct batch {
  void *p[BATCH];
  uint64_t tag[BATCH];
  size_t n;
};

static void *freer(void *arg) {
  (void)arg;
  double spent = 0;
  long freed = 0;
  for (;;) {
    struct batch *b;
    while (!(b = atomic_exchange_explicit(&slot, NULL, memory_order_acquire))) {
      if (atomic_load(&stop)) goto done;
      sched_yield();
    }
    for (int i = 0; i < BATCH; i++) pat_check(b->p[i], b->n, b->tag[i], "fastpath-remote");
    double t0 = now_s();
    for (int i = 0; i < BATCH; i++) free(b->p[i]);
    spent += now_s() - t0;
    freed += BATCH;
    free(b);
  }
done:
  remote_free_ns = freed ? spent * 1e9 / (double)freed : 0;
  return NULL;
}

static double remote(size_t n, long iters, uint64_t *rng) {
  pthread_t t;
  atomic_store(&stop, 0);
  xpthread_create(&t, freer, NULL);
  for (long done = 0; done < iters; done += BATCH) {
    struct batch *b = xmalloc(sizeof *b);
    b->n = n;
    for (int i = 0; i < BATCH; i++) {
      b->tag[i] = rng_next(rng);
      b->p[i] = xmalloc(n);
      pat_fill(b->p[i], n, b->tag[i]);
    }
    void *expected = NULL;
    while (!atomic_compare_exchange_weak_explicit(&slot, &expected, b, memory_order_release, memory_order_relaxed)) {
      expected = NULL;
      sched_yield();
    }
  }
  while (atomic_load(&slot)) sched_yield();
  atomic_store(&stop, 1);
  pthread_join(t, NULL);
  return remote_free_ns;
}

#define REPLACE_LIVE 5000 /* larson's blocks per thread */

/* -m replace: free a random live block, allocate one of a random 8-1000 B size in its place and write two bytes of it
 * (larson's exercise_heap, on one thread: every free is the owner's, into pages of all its classes). */
static double replace(long iters, uint64_t *rng) {
  unsigned char **live = xmalloc(REPLACE_LIVE * sizeof *live);
  for (int i = 0; i < REPLACE_LIVE; i++) live[i] = xmalloc(rng_range(rng, 8, 1000));
  double t0 = now_s();
  for (long i = 0; i < iters; i++) {
    size_t v = rng_next(rng) % REPLACE_LIVE;
    free(live[v]);
    unsigned char *p = xmalloc(rng_range(rng, 8, 1000));
    p[0] = 'a';
    p[1] = 'b';
    KEEP(p);
    live[v] = p;
  }
  double ns = (now_s() - t0) * 1e9 / (double)iters;
  for (int i = 0; i < REPLACE_LIVE; i++) free(live[i]);
  free(live);
  return ns;
}

int main(int argc, char **argv) {
  struct bench_opts o = {.threads = 1, .iters = 10000000, .size = 0, .seed = 1, .mode = "all"};
  bench_parse(argc, argv, &o,
              "fastpath: -n pairs per size, -s one size only (0: 16, 64, 256, 1024, 8192), -m pairs|remote|all|replace");
  static const size_t sizes[] = {16, 64, 256, 1024, 8192};
  int do_pairs = !strcmp(o.mode, "all") || !strcmp(o.mode, "pairs");
  int do_remote = !strcmp(o.mode, "all") || !strcmp(o.mode, "remote");
  int do_replace = !strcmp(o.mode, "replace");   /* not in `all`: the suite's fastpath figures stay what they were */
  if (!do_pairs && !do_remote && !do_replace) {
    fprintf(stderr, "fastpath: unknown mode '%s' (accepted: pairs, remote, all, replace)\n", o.mode);
    return 2;
  }
  char extra[1024] = "";
  size_t len = 0;
  long ops = 0;
  uint64_t rng = rng_seed(o.seed, 0);
  double t0 = now_s();
  if (do_pairs) {
    for (int k = 0; k < 5; k++) {
      if (o.size && (size_t)o.size != sizes[k]) continue;
      double ns = pairs(sizes[k], o.iters);
      len += (size_t)snprintf(extra + len, sizeof extra - len, "%s\"ns_pair_%zu\": %.3f", len ? ", " : "", sizes[k], ns);
      ops += o.iters;
    }
    if (o.size && !ops) {
      double ns = pairs((size_t)o.size, o.iters);
      len += (size_t)snprintf(extra + len, sizeof extra - len, "\"ns_pair_%ld\": %.3f", o.size, ns);
      ops += o.iters;
    }
  }
  if (do_remote) {
    long n = o.iters / 4 > BATCH ? o.iters / 4 : BATCH;
    double ns = remote(o.size ? (size_t)o.size : 64, n, &rng);
    len += (size_t)snprintf(extra + len, sizeof extra - len, "%s\"ns_remote_free\": %.3f", len ? ", " : "", ns);
    ops += n;
  }
  if (do_replace) {
    double ns = replace(o.iters, &rng);
    len += (size_t)snprintf(extra + len, sizeof extra - len, "\"ns_replace\": %.3f", ns);
    ops += o.iters;
  }
  bench_result("fastpath", &o, ops, now_s() - t0, "%s", extra);
  return 0;
}
