/* Aligned allocation: posix_memalign, memalign and aligned_alloc with alignments 16-4096 and random sizes, alignment checked. */
#include "common.h"
#include <malloc.h>

struct obj {
  void *p;
  size_t n;
  uint64_t tag;
};

struct worker {
  long rounds, live;
  int use_aligned_alloc;
  uint64_t rng;
  struct obj *set;
  long misaligned;
};

static void *get(struct worker *w, size_t align, size_t n, long i) {
  void *p = NULL;
  int which = (int)(i % (w->use_aligned_alloc ? 3 : 2));
  if (which == 0) {
    if (posix_memalign(&p, align, n)) p = NULL;
  } else if (which == 1) {
    p = memalign(align, n);
  } else {
    /* C11 wants the size to be a multiple of the alignment. */
    p = aligned_alloc(align, (n + align - 1) & ~(align - 1));
  }
  if (!p) {
    fprintf(stderr, "aligned: allocation of %zu bytes aligned to %zu failed\n", n, align);
    exit(4);
  }
  if ((uintptr_t)p & (align - 1)) {
    if (w->misaligned++ == 0)
      fprintf(stderr, "aligned: %s(%zu, %zu) returned %p, not aligned\n",
              which == 0 ? "posix_memalign" : which == 1 ? "memalign" : "aligned_alloc", align, n, p);
  }
  return p;
}

static void *run(void *arg) {
  struct worker *w = arg;
  for (long j = 0; j < w->live; j++) w->set[j].p = NULL;
  for (long i = 0; i < w->rounds; i++) {
    struct obj *s = &w->set[rng_next(&w->rng) % (uint64_t)w->live];
    if (s->p) {
      pat_check(s->p, s->n, s->tag, "aligned");
      free(s->p);
    }
    size_t align = (size_t)16 << (rng_next(&w->rng) % 9); /* 16 .. 4096 */
    s->n = rng_range(&w->rng, 8, 8192);
    s->tag = rng_next(&w->rng);
    s->p = get(w, align, s->n, i);
    pat_fill(s->p, s->n, s->tag);
  }
  for (long j = 0; j < w->live; j++)
    if (w->set[j].p) {
      pat_check(w->set[j].p, w->set[j].n, w->set[j].tag, "aligned-final");
      free(w->set[j].p);
    }
  return NULL;
}

int main(int argc, char **argv) {
  struct bench_opts o = {.threads = 1, .iters = 200000, .size = 1000, .seed = 1, .mode = "posix"};
  bench_parse(argc, argv, &o,
              "aligned: -t threads, -n allocations per thread, -s live objects per thread,\n"
              "  -m posix (posix_memalign and memalign) | all (also aligned_alloc); a -strict suffix (posix-strict,\n"
              "  all-strict) makes a misaligned block fail the run (exit 6) instead of being counted");
  int all = strcmp(o.mode, "all") == 0 || strcmp(o.mode, "all-strict") == 0;
  int strict = strcmp(o.mode, "posix-strict") == 0 || strcmp(o.mode, "all-strict") == 0;
  if (!all && !strict && strcmp(o.mode, "posix")) {
    fprintf(stderr, "aligned: unknown mode '%s' (accepted: posix, all, posix-strict, all-strict)\n", o.mode);
    return 2;
  }
  struct worker *ws = calloc((size_t)o.threads, sizeof *ws);
  pthread_t *th = calloc((size_t)o.threads, sizeof *th);
  double t0 = now_s();
  for (int i = 0; i < o.threads; i++) {
    ws[i] = (struct worker){.rounds = o.iters, .live = o.size > 0 ? o.size : 1, .use_aligned_alloc = all,
                            .rng = rng_seed(o.seed, (uint64_t)i)};
    ws[i].set = xmalloc((size_t)ws[i].live * sizeof(struct obj));
    xpthread_create(&th[i], run, &ws[i]);
  }
  long misaligned = 0;
  for (int i = 0; i < o.threads; i++) {
    pthread_join(th[i], NULL);
    misaligned += ws[i].misaligned;
    free(ws[i].set);
  }
  double secs = now_s() - t0;
  free(ws);
  free(th);
  bench_result("aligned", &o, o.iters * o.threads, secs, "\"mode\": \"%s\", \"misaligned\": %ld", o.mode, misaligned);
  /* A misaligned block is a defect of the allocator: reported in RESULT (and fatal with -x), so the run is still timed. */
  return misaligned && strict ? 6 : 0;
}
