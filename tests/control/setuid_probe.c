/* setuid_probe.c — linked with libmallard.a for the set-UID test: reports its identity and secure-execution mode. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/auxv.h>
#include <unistd.h>

int main(void) {
  char *volatile p = malloc(100);   /* volatile: the allocation (and so the allocator's initialisation) stays */
  if (!p) return 3;
  p[0] = 1;
  free(p);
  printf("ruid=%d euid=%d secure=%lu\n", (int)getuid(), (int)geteuid(), getauxval(AT_SECURE));
  return 0;
}
