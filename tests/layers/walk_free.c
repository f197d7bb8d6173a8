/* tests/layers/walk_free.c — the functions a free of another thread's block enters, in order, with their call sites
 * (built with -finstrument-functions by scripts/walk_free.sh, which names their files and checks the layers). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include "mallard.h"

#define MAXT 4096
static void *trace[MAXT], *sites[MAXT], *best_trace[MAXT], *best_sites[MAXT];
static int ntrace, best_n = -1, on;

__attribute__((no_instrument_function)) void __cyg_profile_func_enter(void *fn, void *site) {
  if (on && ntrace < MAXT) { sites[ntrace] = site; trace[ntrace++] = fn; }
}
__attribute__((no_instrument_function)) void __cyg_profile_func_exit(void *fn, void *site) { (void)fn; (void)site; }

__attribute__((no_instrument_function)) static void keep_if_longest(void) {
  if (ntrace <= best_n) return;
  best_n = ntrace;
  for (int k = 0; k < ntrace; k++) { best_trace[k] = trace[k]; best_sites[k] = sites[k]; }
}

static void *blocks[64];
static pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t c = PTHREAD_COND_INITIALIZER;
static int done;

/* The owner: allocates the blocks, then exits (EXIT_OWNER: its pages are abandoned) or waits to the end. */
static void *owner(void *a) {
  (void)a;
  for (int i = 0; i < 64; i++) blocks[i] = mallard_malloc(48);
  pthread_mutex_lock(&m);
  done = 1;
  pthread_cond_broadcast(&c);
  if (!getenv("EXIT_OWNER")) while (done != 2) pthread_cond_wait(&c, &m);
  pthread_mutex_unlock(&m);
  return NULL;
}

int main(void) {
  pthread_t t;
  mallard_free(mallard_malloc(16));
  pthread_create(&t, NULL, owner, NULL);
  pthread_mutex_lock(&m);
  while (!done) pthread_cond_wait(&c, &m);
  pthread_mutex_unlock(&m);
  if (getenv("EXIT_OWNER")) pthread_join(t, NULL);
  for (int i = 0; i < 64; i++) {   /* every block freed by this thread; the longest free is kept */
    ntrace = 0;
    on = 1;
    mallard_free(blocks[i]);
    on = 0;
    keep_if_longest();
  }
  if (getenv("FOLLOW")) {   /* then what the frees set in motion: this thread's next slow paths */
    best_n = -1;
    ntrace = 0;
    on = 1;
    void *q = mallard_malloc(48), *r = mallard_malloc(100000);
    on = 0;
    keep_if_longest();
    mallard_free(q);
    mallard_free(r);
  }
  for (int i = 0; i < best_n; i++) printf("%p %p\n", best_trace[i], best_sites[i]);
  if (!getenv("EXIT_OWNER")) {
    pthread_mutex_lock(&m);
    done = 2;
    pthread_cond_broadcast(&c);
    pthread_mutex_unlock(&m);
    pthread_join(t, NULL);
  }
  return 0;
}
