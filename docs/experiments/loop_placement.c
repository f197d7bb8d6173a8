/* loop_placement.c — issue 39's probe of code placement: glibc-simple's rounds with the timed loop moved by PAD bytes. */
/* Build: cc -O2 -fno-reorder-functions -DPADS='"16+1"' -o loop_placement16 loop_placement.c, one binary per PAD
 * (0, 16, ..., 112; the "+1" keeps .skip's count above 0); run: LD_PRELOAD=LIB ./loop_placement16, which prints
 * seconds. The rounds are glibc-simple's (n blocks of 16, 32 or 64 bytes allocated and filled byte by byte, the first
 * half freed in order, the second in reverse; n = 25, 100, 400, 1,600; 2 M operations each); a filler function of
 * PAD bytes ahead of the loop's function moves where the loop's code sits and nothing else. Not built by the project:
 * docs/PERFORMANCE.md (issue 39, forty-first pass) quotes it. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#ifndef PADS
#define PADS "1"
#endif

static double seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Only its size matters: the loop's function is laid out after it (-fno-reorder-functions). */
__attribute__((noinline, aligned(64))) void placement_filler(void) { __asm__ volatile(".skip " PADS ", 0x90"); }

__attribute__((noinline)) void rounds(size_t iters, size_t size, int n, char **slot) {
  for (size_t j = 0; j < iters; j++) {
    for (int i = 0; i < n; i++) {
      slot[i] = malloc(size);
      for (int g = 0; g < (int)size; g++) slot[i][g] = (char)g;   /* char stores: slot[i] is read again each time */
    }
    for (int i = 0; i < n / 2; i++) free(slot[i]);
    for (int i = n - 1; i >= n / 2; i--) free(slot[i]);
  }
}

int main(void) {
  static const int counts[4] = {25, 100, 400, 1600};
  char **slot = malloc(1600 * sizeof *slot);
  if (!slot) return 1;
  double t0 = seconds();
  for (int s = 0; s < 3; s++)
    for (int k = 0; k < 4; k++) rounds(2000000 / (size_t)counts[k], (size_t)16 << s, counts[k], slot);
  printf("%.3f\n", seconds() - t0);
  free(slot);
  return 0;
}
