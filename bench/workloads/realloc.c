/* Realloc growth: vectors (geometric growth) and strings (small appends) growing to 1 MiB, then shrinking by halves. */
#include "common.h"

struct worker {
  long buffers;
  size_t max;
  uint64_t rng;
  long reallocs;
};

/* Every byte of a buffer is written with its pattern, so any subset of positions may be checked. */
static unsigned char *grow(unsigned char *p, size_t *cur, size_t next, uint64_t tag, long *count) {
  pat_check(p, *cur, tag, "realloc-grow");
  unsigned char *q = realloc(p, next);
  if (!q) {
    fprintf(stderr, "realloc: realloc(%zu) failed\n", next);
    exit(4);
  }
  /* The old contents must have moved with the block. */
  pat_check(q, *cur, tag, "realloc-moved");
  pat_set(q, *cur, next, tag);
  *cur = next;
  (*count)++;
  return q;
}

static void *run(void *arg) {
  struct worker *w = arg;
  for (long b = 0; b < w->buffers; b++) {
    int is_string = (int)(b & 1);
    uint64_t tag = rng_next(&w->rng);
    size_t cur = is_string ? 1 : 16;
    unsigned char *p = xmalloc(cur);
    pat_fill(p, cur, tag);
    while (cur < w->max) {
      /* A vector grows by half its size; a string appends 1-64 bytes at a time until 64 KiB, then doubles. */
      size_t next = is_string ? (cur < 65536 ? cur + rng_range(&w->rng, 1, 64) : cur * 2) : cur + cur / 2 + 8;
      if (next > w->max) next = w->max;
      p = grow(p, &cur, next, tag, &w->reallocs);
    }
    while (cur > 16) {
      size_t next = cur / 2;
      pat_check_prefix(p, cur, next, tag, "realloc-shrink");
      unsigned char *q = realloc(p, next);
      if (!q) {
        fprintf(stderr, "realloc: shrinking realloc(%zu) failed\n", next);
        exit(4);
      }
      p = q;
      cur = next;
      w->reallocs++;
      pat_check(p, cur, tag, "realloc-shrunk");
    }
    free(p);
  }
  return NULL;
}

int main(int argc, char **argv) {
  struct bench_opts o = {.threads = 1, .iters = 40, .size = 1 << 20, .seed = 1};
  bench_parse(argc, argv, &o, "realloc: -t threads, -n buffers per thread (half vectors, half strings), -s maximum bytes");
  struct worker *ws = calloc((size_t)o.threads, sizeof *ws);
  pthread_t *th = calloc((size_t)o.threads, sizeof *th);
  double t0 = now_s();
  for (int i = 0; i < o.threads; i++) {
    ws[i] = (struct worker){.buffers = o.iters, .max = o.size > 32 ? (size_t)o.size : 32,
                            .rng = rng_seed(o.seed, (uint64_t)i)};
    xpthread_create(&th[i], run, &ws[i]);
  }
  long ops = 0;
  for (int i = 0; i < o.threads; i++) {
    pthread_join(th[i], NULL);
    ops += ws[i].reallocs;
  }
  double secs = now_s() - t0;
  free(ws);
  free(th);
  bench_result("realloc", &o, ops, secs, NULL);
  return 0;
}
