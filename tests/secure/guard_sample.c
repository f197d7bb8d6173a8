/* guard_sample.c — misuse in a loop for sampled guarded allocations (guard_sample), run under LD_PRELOAD by
 * test_guard_sample.py: `guard_sample MODE SIZE ITERATIONS`. Each iteration's block address goes to stdout (one
 * line, written at once) before the misuse, so the test can match the report's block against it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *volatile sink;
/* Keep the compiler from reasoning about the misuse (it would warn, or drop the code). */
static void *opaque(void *p) { sink = p; return sink; }
/* memset through a volatile pointer: the compiler cannot drop the stores as dead before a free. */
static void *(*volatile opaque_memset)(void *, int, size_t) = memset;
static void poke(char *p, size_t i) { ((volatile char *)opaque(p))[i] = 'x'; }
static char peek(char *p, size_t i) { return ((volatile char *)opaque(p))[i]; }

static void say(const char *what, const void *p) {
  char line[64];
  int n = snprintf(line, sizeof line, "%s %p\n", what, p);
  if (write(1, line, (size_t)n) != n) exit(3);
}

/* mallard_ctl, looked up (the program does not link Mallard): the value, or -1. */
static long long ctl_u64(const char *name) {
  int (*ctl)(const char *, void *, size_t *, void *, size_t) =
      (int (*)(const char *, void *, size_t *, void *, size_t))dlsym(RTLD_DEFAULT, "mallard_ctl");
  uint64_t v = 0;
  size_t len = sizeof v;
  if (!ctl || ctl(name, &v, &len, NULL, 0) != 0) return -1;
  return (long long)v;
}

int main(int argc, char **argv) {
  if (argc < 4) return 2;
  const char *m = argv[1];
  size_t size = strtoul(argv[2], NULL, 10);
  long iters = strtol(argv[3], NULL, 10);
  long sum = 0;
  for (long i = 0; i < iters; i++) {
    char *p = opaque(malloc(size));
    if (!p) return 4;
    say("block", p);
    if (!strcmp(m, "overflow")) {          /* one byte past the end, then free */
      poke(p, size);
      free(p);
    } else if (!strcmp(m, "underflow")) {  /* one byte before the start */
      poke(p, (size_t)-1);
      free(p);
    } else if (!strcmp(m, "use-after-free")) {   /* a read after free: harmless in an ordinary block */
      free(p);
      sum += peek(p, size / 2);
    } else if (!strcmp(m, "double-free")) {
      free(p);
      free(opaque(p));
    } else if (!strcmp(m, "realloc")) {    /* a guarded block moves and keeps its bytes; sizes are exact */
      opaque_memset(p, 0x33, size);
      if (malloc_usable_size(p) < size) return 5;
      char *q = opaque(realloc(p, size + 1));
      for (size_t k = 0; k < size; k++) if (q[k] != 0x33) return 6;
      free(q);
    } else if (!strcmp(m, "calloc")) {     /* every byte of a calloc'd block is zero, also in a reused slot */
      free(p);
      unsigned char *z = opaque(calloc(1, size));
      for (size_t k = 0; k < size; k++) if (z[k]) return 7;
      opaque_memset(z, 0xff, size);
      free(z);
    } else if (!strcmp(m, "clean")) {      /* the whole block, nothing more; mallard_owns knows it */
      bool (*owns)(const void *) = (bool (*)(const void *))dlsym(RTLD_DEFAULT, "mallard_owns");
      if (owns && !owns(p + size - 1)) return 8;
      opaque_memset(p, 0x44, malloc_usable_size(p));
      free(p);
    } else {
      return 2;
    }
  }
  (void)sum;
  printf("not detected\nsamples %lld reports %lld\n", ctl_u64("stats.guard.samples"), ctl_u64("stats.guard.reports"));
  return 0;
}
