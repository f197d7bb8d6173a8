/* pair_loop.c — N malloc/free pairs of one small size (argv: N, size): callgrind counts instructions per pair. */
#include <stdlib.h>

static void *volatile sink;

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 1000000;
  size_t size = argc > 2 ? (size_t)atol(argv[2]) : 32;
  for (long i = 0; i < n; i++) {
    void *p = malloc(size);
    sink = p;
    free(p);
  }
  return 0;
}
