/* replace_loop.c — issue 39's single-thread proxy for larson: random slots freed and refilled with random sizes; ns per op. */
/* Build: cc -O2 -o replace_loop replace_loop.c; run: LD_PRELOAD=LIB ./replace_loop SLOTS MIN MAX OPS (e.g. 5000 600 1000
 * 5000000). Each operation frees the block of a random slot, allocates one of a random size in [MIN, MAX) into it and
 * writes its first and last byte; a quarter of OPS run first, untimed, to reach the steady state. Not built by the
 * project: docs/PERFORMANCE.md (issue 39, thirty-eighth pass) quotes it. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static unsigned long long rng = 4141;
static unsigned next_random(void) {
  rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
  return (unsigned)(rng >> 33);
}

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s SLOTS MIN MAX OPS\n", argv[0]);
    return 2;
  }
  long n = atol(argv[1]), ops = atol(argv[4]);
  unsigned lo = (unsigned)atoi(argv[2]), hi = (unsigned)atoi(argv[3]);
  if (n < 1 || ops < 1 || lo < 2 || hi <= lo) {
    fprintf(stderr, "%s: SLOTS and OPS must be positive, 2 <= MIN < MAX\n", argv[0]);
    return 2;
  }
  char **slot = calloc((size_t)n, sizeof *slot);
  if (!slot) return 1;
  for (long i = 0; i < n; i++) {
    slot[i] = malloc(lo + next_random() % (hi - lo));
    if (!slot[i]) return 1;
    slot[i][0] = 1;
  }
  struct timespec t0, t1;
  for (long i = -ops / 4; i < ops; i++) {
    if (i == 0) clock_gettime(CLOCK_MONOTONIC, &t0);
    long v = (long)(next_random() % (unsigned)n);
    free(slot[v]);
    size_t size = lo + next_random() % (hi - lo);
    slot[v] = malloc(size);
    if (!slot[v]) return 1;
    slot[v][0] = 1;
    slot[v][size - 1] = 2;
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  printf("ns/op %.3f\n", ((double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec)) / (double)ops);
  return 0;
}
