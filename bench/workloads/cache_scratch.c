/* Cache-scratch: the main thread allocates neighbouring small objects and hands one to each thread, which frees it and keeps reusing memory. */
#include "common.h"

struct worker {
  unsigned char *first;   /* allocated by the main thread, next to the other workers' objects */
  uint64_t first_tag;
  long rounds, writes;
  size_t n;
  uint64_t rng;
};

/* Flips every byte of the object `writes` times (an even count), so the pattern is intact afterwards. */
static void hammer(volatile unsigned char *p, size_t n, long writes) {
  for (long r = 0; r < writes; r++)
    for (size_t b = 0; b < n; b++) p[b] ^= 0xff;
}

static void *run(void *arg) {
  struct worker *w = arg;
  /* Freeing the main thread's object may put its memory in this thread's cache: passive false sharing. */
  pat_check(w->first, w->n, w->first_tag, "cache-scratch-first");
  free(w->first);
  for (long i = 0; i < w->rounds; i++) {
    uint64_t tag = rng_next(&w->rng);
    unsigned char *p = xmalloc(w->n);
    pat_fill(p, w->n, tag);
    hammer(p, w->n, w->writes);
    pat_check(p, w->n, tag, "cache-scratch");
    free(p);
  }
  return NULL;
}

int main(int argc, char **argv) {
  /* -w is reused as the number of write passes per object (rounded up to an even count). */
  struct bench_opts o = {.threads = 2, .iters = 20000, .size = 8, .seed = 1, .wait_ms = 200};
  bench_parse(argc, argv, &o, "cache-scratch: -t threads, -n objects per thread, -s object size, -w write passes");
  long writes = (o.wait_ms + 1) & ~1L;
  size_t n = o.size ? (size_t)o.size : 1;
  struct worker *ws = calloc((size_t)o.threads, sizeof *ws);
  pthread_t *th = calloc((size_t)o.threads, sizeof *th);
  for (int i = 0; i < o.threads; i++) {
    ws[i] = (struct worker){.rounds = o.iters, .writes = writes, .n = n, .rng = rng_seed(o.seed, (uint64_t)i)};
    ws[i].first_tag = rng_next(&ws[i].rng);
    ws[i].first = xmalloc(n);
    pat_fill(ws[i].first, n, ws[i].first_tag);
  }
  double t0 = now_s();
  for (int i = 0; i < o.threads; i++) xpthread_create(&th[i], run, &ws[i]);
  for (int i = 0; i < o.threads; i++) pthread_join(th[i], NULL);
  double secs = now_s() - t0;
  free(ws);
  free(th);
  bench_result("cache-scratch", &o, o.iters * o.threads, secs, "\"writes\": %ld", writes);
  return 0;
}
