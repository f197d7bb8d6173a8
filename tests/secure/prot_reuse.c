/* prot_reuse.c — spans that carry guard pages or inaccessible freed blocks are reused: every byte handed out must be
 * writable, and pages that come back to the same place must not pay mprotect again. It defines mprotect (exported
 * with -rdynamic, so it interposes libc's for the preloaded library) to count the calls. Modes:
 *   churn: 300 threads one after another, each fills and frees 300 blocks of 4000 bytes, then exits; prints
 *          "mprotect N" for the last 200 threads.
 *   mixed: large blocks (300 KiB-1.9 MiB, inaccessible once freed) freed and reallocated, grown and shrunk in
 *          place, with small blocks of every class taking the same spans in between; every byte of every block
 *          written and checked. Prints "ok" (a span handed out with a closed page faults instead).
 *   kinds: large blocks (inaccessible once freed) freed between rounds of small blocks of four page sizes (1, 2,
 *          5 and 16 slots); prints "mprotect N" for the small rounds after the first 100 (a small page cut where a
 *          large block or a page of another size was opens a slot and guards its new end).
 *   grow:  one block realloc'd from 300 KiB to 1.9 MiB by 16 KiB steps (a vector's growth), its new bytes written
 *          each time; prints "mprotect N" for the whole growth (each growth in place moves the guard slot: two
 *          calls, so a block grown exactly as asked pays about two per 64 KiB). */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static _Atomic(long) calls;

int mprotect(void *addr, size_t len, int prot) {
  atomic_fetch_add(&calls, 1);
  long r = syscall(SYS_mprotect, addr, len, prot);
  return r == 0 ? 0 : -1;   /* syscall() has set errno */
}

static void fill(unsigned char *p, size_t n, unsigned char v) { memset(p, v, n); }

static void check(const unsigned char *p, size_t n, unsigned char v, const char *what) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != v) { printf("%s: byte %zu of %p is %x, not %x\n", what, i, (const void *)p, p[i], v); exit(2); }
}

static void *churn_thread(void *arg) {
  (void)arg;
  void *b[300];
  for (int i = 0; i < 300; i++) { b[i] = malloc(4000); fill(b[i], malloc_usable_size(b[i]), 0x5a); }
  for (int i = 0; i < 300; i++) free(b[i]);
  return NULL;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return rng; }

int main(int argc, char **argv) {
  const char *m = argc > 1 ? argv[1] : "";
  if (!strcmp(m, "churn")) {
    long before = 0;
    for (int t = 0; t < 300; t++) {
      if (t == 100) before = atomic_load(&calls);
      pthread_t th;
      if (pthread_create(&th, NULL, churn_thread, NULL) != 0) { perror("pthread_create"); return 1; }
      pthread_join(th, NULL);
    }
    printf("mprotect %ld\n", atomic_load(&calls) - before);
    return 0;
  }
  if (!strcmp(m, "grow")) {
    size_t n = 300u << 10;
    unsigned char *p = malloc(n);
    if (!p) { printf("malloc failed\n"); return 1; }
    fill(p, n, 0x33);
    long before = atomic_load(&calls);
    for (size_t m2 = n + (16u << 10); m2 <= (1900u << 10); m2 += 16u << 10) {
      unsigned char *q = realloc(p, m2);
      if (!q) { printf("realloc failed\n"); return 1; }
      check(q, n, 0x33, "grow");
      fill(q + n, m2 - n, 0x33);
      p = q;
      n = m2;
    }
    printf("mprotect %ld\n", atomic_load(&calls) - before);
    free(p);
    return 0;
  }
  if (!strcmp(m, "kinds")) {
    static const size_t sizes[4] = { 4000, 12000, 36000, 200000 };   /* default slab_sizes: 1, 2, 5, 16 slots */
    long counted = 0;
    for (int round = 0; round < 300; round++) {
      size_t n = (300u << 10) + (size_t)(next() % (1200u << 10));
      unsigned char *big = malloc(n);
      if (!big) { printf("malloc failed\n"); return 1; }
      fill(big, n, 0x44);
      free(big);
      long before = atomic_load(&calls);
      /* 3 to 8 pages of each size (more than a thread keeps empty), taken in an order that changes every round */
      void *s[4][40];
      for (int j = 0; j < 4; j++) {
        int k = round & 1 ? 3 - j : j;
        for (int i = 0; i < 40; i++) { s[k][i] = malloc(sizes[k]); fill(s[k][i], sizes[k], 0x55); }
      }
      for (int k = 0; k < 4; k++)
        for (int i = 0; i < 40; i++) free(s[k][i]);
      if (round >= 100) counted += atomic_load(&calls) - before;
    }
    printf("mprotect %ld\n", counted);
    return 0;
  }
  if (!strcmp(m, "mixed")) {
    enum { LIVE = 6 };
    unsigned char *big[LIVE] = { 0 };
    size_t len[LIVE] = { 0 };
    for (int round = 0; round < 400; round++) {
      int k = (int)(next() % LIVE);
      if (big[k]) { check(big[k], len[k], (unsigned char)k, "large"); free(big[k]); }
      len[k] = (300u << 10) + (size_t)(next() % (1600u << 10));
      big[k] = malloc(len[k]);
      if (!big[k]) { printf("malloc failed\n"); return 1; }
      fill(big[k], malloc_usable_size(big[k]), (unsigned char)k);
      if (round % 3 == 0) {   /* grow or shrink, in place where the arena can */
        size_t n = (200u << 10) + (size_t)(next() % (1800u << 10));
        unsigned char *q = realloc(big[k], n);
        if (!q) { printf("realloc failed\n"); return 1; }
        check(q, n < len[k] ? n : len[k], (unsigned char)k, "realloc");
        big[k] = q;
        len[k] = n;
        fill(q, malloc_usable_size(q), (unsigned char)k);
      }
      /* Small blocks of every class up to 32 KiB, on pages that may be cut from the spans just freed. */
      void *s[64];
      for (int i = 0; i < 64; i++) {
        size_t n = (size_t)16 << (next() % 12);
        n += (size_t)(next() % n);
        s[i] = malloc(n);
        fill(s[i], malloc_usable_size(s[i]), 0x33);
      }
      for (int i = 0; i < 64; i++) free(s[i]);
    }
    for (int k = 0; k < LIVE; k++) free(big[k]);
    printf("ok\n");
    return 0;
  }
  fprintf(stderr, "usage: prot_reuse churn|kinds|grow|mixed\n");
  return 1;
}
