/* accuracy.c — a program with known allocation sites for the heap profiler's accuracy tests: leak_site leaks 1,000
 * blocks of 10,240 bytes, hold_site holds 800 blocks of 64 KiB (50 MiB) until after the dump, churn_site allocates
 * 1 GiB through short-lived blocks of mixed sizes. Writes the profile to argv[1] through mallard_ctl("prof.dump"). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *leaked[1000], *held[800];
static volatile size_t sink;

__attribute__((noinline)) void leak_site(void) {
  for (int i = 0; i < 1000; i++) { leaked[i] = malloc(10240); memset(leaked[i], 1, 64); }
}

__attribute__((noinline)) void hold_site(void) {
  for (int i = 0; i < 800; i++) { held[i] = malloc(65536); memset(held[i], 2, 64); }
}

__attribute__((noinline)) void churn_site(void) {
  static const size_t sizes[] = { 16, 24, 48, 100, 256, 640, 1024, 3000, 4096, 8192, 20000, 1000 };   /* sum 39,096 */
  void *window[8] = { 0 };
  size_t total = 0, i = 0;
  while (total < ((size_t)1 << 30)) {
    size_t s = sizes[i % 12];
    free(window[i % 8]);
    window[i % 8] = malloc(s);
    ((char *)window[i % 8])[0] = (char)i;
    sink += s;
    total += s;
    i++;
  }
  for (int k = 0; k < 8; k++) free(window[k]);
}

/* The sites' common caller: tests check that stacks reach it (main itself may sit in .text.startup, which some
 * symbolisers miss). */
__attribute__((noinline)) void run_sites(void) {
  leak_site();
  hold_site();
  churn_site();
  sink++;   /* no tail call: churn_site's stack goes through run_sites too */
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  int (*ctl)(const char *, void *, size_t *, void *, size_t) =
      (int (*)(const char *, void *, size_t *, void *, size_t))dlsym(RTLD_DEFAULT, "mallard_ctl");
  if (!ctl) { fprintf(stderr, "not running under libmallard\n"); return 2; }
  run_sites();
  const char *path = argv[1];
  int r = ctl("prof.dump", NULL, NULL, &path, sizeof path);
  if (r) { fprintf(stderr, "prof.dump: %d\n", r); return 1; }
  for (int i = 0; i < 800; i++) free(held[i]);
  return 0;
}
