/* advise_workload.c — workloads built to trigger each tuning advice; each ends by writing a JSON statistics dump. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "mallard.h"

static void write_file(void *opaque, const char *s) { fputs(s, (FILE *)opaque); }

/* Many threads on one arena, all taking and returning large blocks: the arena lock is contended. */
static void *contend(void *arg) {
  (void)arg;
  for (int i = 0; i < 20000; i++) {
    void *p = mallard_malloc((size_t)(300 + (i % 7) * 100) * 1024);
    mallard_free(p);
  }
  return NULL;
}

/* Medium blocks allocated and freed in bursts: pages of few objects are taken and returned over and over. A burst of
 * 16 blocks fills the four pages the advice's page cache holds once its pages are doubled (4 blocks each), so that
 * following the advice settles it; with 20 (five pages) one page a burst still came from the arena, and, as the
 * empty page kept with the heap came and went with the 4 ms clock, sometimes 2.5: at the rule's threshold. */
static void refills(void) {
  enum { BURST = 16 };
  void *ps[BURST];
  for (int r = 0; r < 25000; r++) {
    for (int i = 0; i < BURST; i++) ps[i] = mallard_malloc(100 * 1024);
    for (int i = 0; i < BURST; i++) mallard_free(ps[i]);
  }
}

/* Lots of memory freed just now, with a long decay and no purging thread: dirty memory waits. */
static void dirty(void) {
  enum { N = 600 };
  void *ps[N];
  for (int i = 0; i < N; i++) { ps[i] = mallard_malloc(1 << 20); memset(ps[i], 1, 1 << 20); }
  for (int i = 0; i < N; i++) mallard_free(ps[i]);
}

/* Threads that each keep a few tiny blocks: the working set is far smaller than the metadata. */
static void *tiny(void *arg) {
  void **keep = arg;
  *keep = mallard_malloc(16);
  return NULL;
}

/* A healthy program: a moderate working set reused in place. */
static void healthy(void) {
  void *ps[2000];
  for (int i = 0; i < 2000; i++) ps[i] = mallard_malloc((size_t)(16 + (i % 64) * 16));
  for (int r = 0; r < 200; r++)
    for (int i = 0; i < 2000; i++) { mallard_free(ps[i]); ps[i] = mallard_malloc((size_t)(16 + ((i + r) % 64) * 16)); }
}

/* Ordinary programs that need no tuning. Allocate three million small blocks, then free them all. */
static void allocfree(void) {
  enum { N = 3000000 };
  void **ps = mallard_malloc(N * sizeof *ps);
  for (int i = 0; i < N; i++) ps[i] = mallard_malloc((size_t)(16 + (i % 4) * 16));
  for (int i = 0; i < N; i++) mallard_free(ps[i]);
  mallard_free(ps);
}

/* A steady state: 100000 live blocks of mixed sizes, replaced one by one. */
static void steady(void) {
  enum { N = 100000 };
  void **ps = mallard_malloc(N * sizeof *ps);
  unsigned x = 1;
  for (int i = 0; i < N; i++) ps[i] = mallard_malloc((size_t)(8 + i % 500));
  for (int r = 0; r < 2000000; r++) {
    x = x * 1103515245u + 12345u;
    unsigned i = (x >> 8) % N;
    mallard_free(ps[i]);
    ps[i] = mallard_malloc((size_t)(8 + (x >> 4) % 500));
  }
  for (int i = 0; i < N; i++) mallard_free(ps[i]);
  mallard_free(ps);
}

/* A thread pool: four workers, each handling requests that allocate a few buffers and free them. */
static void *worker(void *arg) {
  unsigned x = (unsigned)(uintptr_t)arg;
  for (int req = 0; req < 100000; req++) {
    void *b[8];
    for (int i = 0; i < 8; i++) { x = x * 1103515245u + 12345u; b[i] = mallard_malloc((size_t)(32 + (x >> 8) % 4000)); }
    for (int i = 0; i < 8; i++) mallard_free(b[i]);
  }
  return NULL;
}

int main(int argc, char **argv) {
  if (argc != 3) { fprintf(stderr, "usage: advise_workload contention|refills|dirty|metadata|healthy|allocfree|steady|threadpool OUT.json\n"); return 2; }
  const char *w = argv[1];
  if (!strcmp(w, "contention")) {
    pthread_t t[8];
    for (int i = 0; i < 8; i++) pthread_create(&t[i], NULL, contend, NULL);
    for (int i = 0; i < 8; i++) pthread_join(t[i], NULL);
  } else if (!strcmp(w, "refills")) {
    refills();
  } else if (!strcmp(w, "dirty")) {
    dirty();
  } else if (!strcmp(w, "metadata")) {
    static void *keep[200];
    for (int i = 0; i < 200; i++) {
      pthread_t t;
      pthread_create(&t, NULL, tiny, &keep[i]);
      pthread_join(t, NULL);
    }
  } else if (!strcmp(w, "healthy")) {
    healthy();
  } else if (!strcmp(w, "allocfree")) {
    allocfree();
  } else if (!strcmp(w, "steady")) {
    steady();
  } else if (!strcmp(w, "threadpool")) {
    pthread_t t[4];
    for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)(i + 1));
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  } else {
    fprintf(stderr, "unknown workload %s\n", w);
    return 2;
  }
  FILE *f = fopen(argv[2], "w");
  if (!f) { perror(argv[2]); return 1; }
  mallard_stats_print(write_file, f, "J");
  fclose(f);
  return 0;
}
