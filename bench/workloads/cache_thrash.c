/* Cache-thrash: threads allocate small objects concurrently and write them hard; neighbouring objects given to different threads share cache lines. */
#include "common.h"

struct worker {
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
  for (long i = 0; i < w->rounds; i++) {
    uint64_t tag = rng_next(&w->rng);
    unsigned char *p = xmalloc(w->n);
    pat_fill(p, w->n, tag);
    hammer(p, w->n, w->writes);
    pat_check(p, w->n, tag, "cache-thrash");
    free(p);
  }
  return NULL;
}

int main(int argc, char **argv) {
  /* -w is reused as the number of write passes per object (rounded up to an even count). */
  struct bench_opts o = {.threads = 2, .iters = 20000, .size = 8, .seed = 1, .wait_ms = 200};
  bench_parse(argc, argv, &o, "cache-thrash: -t threads, -n objects per thread, -s object size, -w write passes");
  long writes = (o.wait_ms + 1) & ~1L;
  struct worker *ws = calloc((size_t)o.threads, sizeof *ws);
  pthread_t *th = calloc((size_t)o.threads, sizeof *th);
  double t0 = now_s();
  for (int i = 0; i < o.threads; i++) {
    ws[i] = (struct worker){.rounds = o.iters, .writes = writes, .n = o.size ? (size_t)o.size : 1,
                            .rng = rng_seed(o.seed, (uint64_t)i)};
    xpthread_create(&th[i], run, &ws[i]);
  }
  for (int i = 0; i < o.threads; i++) pthread_join(th[i], NULL);
  double secs = now_s() - t0;
  free(ws);
  free(th);
  bench_result("cache-thrash", &o, o.iters * o.threads, secs, "\"writes\": %ld", writes);
  return 0;
}
