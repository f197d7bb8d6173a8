/* misuse.c — commits one kind of heap misuse (named on the command line) for the secure variant's tests. */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *shared;
static void *remote_free(void *arg) { (void)arg; free(shared); return NULL; }
static void *volatile sink;

/* Keep the compiler from reasoning about the misuse (it would warn, or drop the code). */
static void *opaque(void *p) { sink = p; return sink; }

int main(int argc, char **argv) {
  const char *m = argc > 1 ? argv[1] : "";
  char *p = malloc(40);
  memset(p, 1, 40);
  if (!strcmp(m, "none")) {
    free(p);
  } else if (!strcmp(m, "double-free")) {
    free(p);
    free(opaque(p));
  } else if (!strcmp(m, "interior-free")) {
    free((char *)opaque(p) + 16);
  } else if (!strcmp(m, "misaligned-free")) {
    free((char *)opaque(p) + 1);
  } else if (!strcmp(m, "stack-free")) {
    int x;
    free(opaque(&x));
  } else if (!strcmp(m, "foreign-free")) {
    static char buf[64];
    free(opaque(buf));
  } else if (!strcmp(m, "overflow")) {
    size_t u = malloc_usable_size(p);
    memset(opaque(p), 0x41, u + 1);   /* one byte past the usable size */
    free(p);
  } else if (!strcmp(m, "overflow-realloc")) {
    size_t u = malloc_usable_size(p);
    memset(opaque(p), 0x41, u + 8);
    p = realloc(p, 4000);
  } else if (!strcmp(m, "use-after-free")) {
    free(p);
    memset(opaque(p), 0x42, 8);      /* clobbers the encoded free-list link */
    sink = malloc(40);
    sink = malloc(40);
  } else if (!strcmp(m, "remote-double-free")) {
    shared = p;
    pthread_t t;
    pthread_create(&t, NULL, remote_free, NULL);
    pthread_join(t, NULL);
    pthread_create(&t, NULL, remote_free, NULL);
    pthread_join(t, NULL);
  } else if (!strcmp(m, "metadata-guard")) {
    volatile char *seg = (char *)((uintptr_t)p & ~(uintptr_t)((4u << 20) - 1));
    printf("%d\n", seg[60000]);       /* inside the guard between the segment header and user data */
  } else if (!strcmp(m, "huge-guard")) {
    char *h = malloc(5u << 20);
    volatile char *end = h + malloc_usable_size(h);
    end[100] = 1;                     /* just past the huge block */
  } else if (!strcmp(m, "zero-on-free")) {
    char *q = malloc(200);
    memset(q, 0x5a, 200);
    free(q);
    /* The block's bytes after the free-list link must be wiped (the link itself is the first 8). */
    for (int i = 8; i < 192; i++)
      if (((volatile char *)q)[i] != 0) { printf("not wiped at %d\n", i); return 1; }
    printf("wiped\n");
    return 0;
  } else {
    fprintf(stderr, "unknown misuse %s\n", m);
    return 2;
  }
  printf("not detected\n");
  return 0;
}
