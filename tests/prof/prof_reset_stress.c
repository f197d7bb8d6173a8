/* prof_reset_stress.c — the profiler under threads (for ctest's prefixed, preloaded, race-delay and ThreadSanitizer
 * runs): prof.reset while a sampled huge block is resized by mremap (the reset must forget it), while two threads take
 * interval dumps (prof_interval, every sample worth several intervals). Needs MALLARD_CONF=prof:true,prof_sample:1,
 * prof_interval:1M,prof_prefix:DIR/NAME; removes the dumps it wrote. Exit 0 when every check holds. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef MT_PREFIX
#include <mallard.h>
#define M(f) mallard_##f
#else
#include <dlfcn.h>
#define M(f) f
#endif

typedef int (*ctl_fn)(const char *, void *, size_t *, void *, size_t);
static ctl_fn ctl;

#define ROUNDS 300
#define DUMPERS 2
#define DUMPER_ALLOCS 100
static _Atomic(long) round_ready, round_stop, round_stopped, round_checked;
static _Atomic(uint64_t) resized;

static uint64_t stat_of(const char *name) {
  uint64_t v = 0;
  size_t len = sizeof v;
  if (ctl(name, &v, &len, NULL, 0) != 0) { fprintf(stderr, "mallard_ctl(%s) failed\n", name); exit(2); }
  return v;
}

static void *resizer(void *arg) {
  (void)arg;
  for (long r = 1; r <= ROUNDS; r++) {
    void *p = M(malloc)(4u << 20);   /* sampled (prof_sample:1) */
    if (!p) abort();
    atomic_store(&round_ready, r);
    for (uint64_t i = 0; atomic_load(&round_stop) < r; i++) {
      void *q = M(realloc)(p, (i & 1) ? (4u << 20) : (8u << 20));   /* huge: mremap, the record out meanwhile */
      if (!q) abort();
      p = q;
      atomic_fetch_add(&resized, 1);
    }
    atomic_store(&round_stopped, r);
    while (atomic_load(&round_checked) < r) sched_yield();
    M(free)(p);
  }
  return NULL;
}

static void *dumper(void *arg) {
  (void)arg;
  for (int i = 0; i < DUMPER_ALLOCS; i++) {   /* each block: one sample worth 3 intervals, so one dump */
    char *p = M(malloc)(3u << 20);
    if (!p) abort();
    p[0] = 1;
    M(free)(p);
  }
  return NULL;
}

int main(void) {
#ifdef MT_PREFIX
  ctl = mallard_ctl;
#else
  ctl = (ctl_fn)dlsym(RTLD_DEFAULT, "mallard_ctl");
  if (!ctl) { fprintf(stderr, "mallard_ctl not found: run with libmallard preloaded\n"); return 2; }
#endif
  uint64_t dumps0 = stat_of("prof.stats.dumps");
  pthread_t t[1 + DUMPERS];
  if (pthread_create(&t[0], NULL, resizer, NULL) != 0) return 2;
  for (int i = 0; i < DUMPERS; i++)
    if (pthread_create(&t[1 + i], NULL, dumper, NULL) != 0) return 2;
  long bad = 0;
  uint64_t seed = 1;
  for (long r = 1; r <= ROUNDS; r++) {
    if (r == ROUNDS / 2 + 1)   /* the second half: the resizer alone, every record checked exactly */
      for (int i = 0; i < DUMPERS; i++) pthread_join(t[1 + i], NULL);
    while (atomic_load(&round_ready) < r) sched_yield();
    uint64_t c0 = atomic_load(&resized);
    while (atomic_load(&resized) < c0 + 1) sched_yield();   /* the resizer is in its loop */
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    for (volatile unsigned k = (unsigned)(seed >> 51); k; k--) {}   /* 0..8191 spins: the reset meets it anywhere */
    if (ctl("prof.reset", NULL, NULL, NULL, 0) != 0) return 2;
    atomic_store(&round_stop, r);
    while (atomic_load(&round_stopped) < r) sched_yield();   /* a resize under way at the reset has ended */
    /* Forgotten by the reset, the block may not be followed again. In the first half each dumper may hold one block
     * sampled after the reset. */
    bad += stat_of("prof.stats.live") > (r <= ROUNDS / 2 ? DUMPERS : 0) ? 1 : 0;
    atomic_store(&round_checked, r);
  }
  pthread_join(t[0], NULL);
  uint64_t live = stat_of("prof.stats.live"), dumps = stat_of("prof.stats.dumps") - dumps0;
  /* Clean up: PREFIX.PID.SEQ.pb.gz for every SEQ written. */
  const char *prefix = NULL;
  size_t len = sizeof prefix;
  if (ctl("opt.prof_prefix", &prefix, &len, NULL, 0) == 0 && prefix)
    for (uint64_t s = 0; s < dumps0 + dumps + 16; s++) {
      char path[4096];
      snprintf(path, sizeof path, "%s.%d.%llu.pb.gz", prefix, (int)getpid(), (unsigned long long)s);
      unlink(path);
    }
  printf("rounds %d bad %ld live %llu dumps %llu\n", ROUNDS, bad, (unsigned long long)live, (unsigned long long)dumps);
  if (bad || live) return 1;
  if (dumps < DUMPERS * DUMPER_ALLOCS) return 1;   /* one dump per sample worth several intervals */
  return 0;
}
