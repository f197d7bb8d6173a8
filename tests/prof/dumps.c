/* dumps.c — test program for the profiler's automatic dumps (prof_interval, prof_signal) and its records across
 * prof.reset; run with libmallard preloaded by tests/prof/test_prof_dumps.py. Modes:
 *   blocks SIZE COUNT   allocate and free COUNT blocks of SIZE bytes; prints "samples N dumps D"
 *   raise SIG           raise signal SIG, then wait (30 s at most) for the dump it asks for; prints "dumps D"
 *   unsafe-interval     samples while the loader says a dlopen is in progress (_r_debug.r_state set to RT_ADD, as
 *                       glibc sets it while it maps objects), then once it is over; prints "in_window D1 after D2"
 *   unsafe-signal SIG   the same for a signal dump taken by a sample (in a fork child, before its dump thread
 *                       runs); prints "in_window D1 after D2"
 *   reset-race ROUNDS   one thread resizes a sampled huge block with realloc (mremap) while another resets the
 *                       profile; prints "live0 L bad B" (B: rounds after which a record forgotten by the reset was
 *                       live again) */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef int (*ctl_fn)(const char *, void *, size_t *, void *, size_t);
static ctl_fn ctl;

static uint64_t stat_of(const char *name) {
  uint64_t v = 0;
  size_t len = sizeof v;
  if (ctl(name, &v, &len, NULL, 0) != 0) { fprintf(stderr, "mallard_ctl(%s) failed\n", name); exit(2); }
  return v;
}

static void pause_ms(long ms) {
  struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
  nanosleep(&ts, NULL);
}

/* Waits (30 s at most: a bound for a broken build, not a timing assertion) until prof.stats.dumps exceeds `than`. */
static uint64_t wait_dumps(uint64_t than) {
  uint64_t d = stat_of("prof.stats.dumps");
  for (int i = 0; i < 3000 && d <= than; i++) {
    pause_ms(10);
    d = stat_of("prof.stats.dumps");
  }
  return d;
}

static void *volatile sink;   /* keeps the compiler from dropping a malloc/free pair */

static int blocks(size_t size, long count) {
  for (long i = 0; i < count; i++) {
    char *p = malloc(size);
    if (!p) return 3;
    p[0] = 1;
    sink = p;
    free(p);
  }
  printf("samples %llu dumps %llu\n", (unsigned long long)stat_of("prof.stats.samples"),
         (unsigned long long)stat_of("prof.stats.dumps"));
  return 0;
}

/* ld.so's own r_debug (found with dlsym: a reference from this executable could make a copy of it by relocation). */
static struct r_debug *loader_debug(void) {
  struct r_debug *r = dlsym(RTLD_DEFAULT, "_r_debug");
  if (!r) { fprintf(stderr, "no _r_debug\n"); exit(2); }
  return r;
}

/* Allocates in a context the profiler must treat as unsafe for dumps, then in a safe one. */
static int unsafe(int sig) {
  struct r_debug *r = loader_debug();
  uint64_t before = stat_of("prof.stats.dumps");
  r->r_state = RT_ADD;   /* what the loader shows while a dlopen maps objects */
  if (sig) raise(sig);
  for (int i = 0; i < 8; i++) { sink = malloc(4096); free(sink); }   /* each one sampled (prof_sample:1) */
  uint64_t in_window = stat_of("prof.stats.dumps") - before;
  r->r_state = RT_CONSISTENT;
  for (int i = 0; i < 8; i++) { sink = malloc(4096); free(sink); }
  uint64_t after = wait_dumps(before) - before;
  printf("in_window %llu after %llu\n", (unsigned long long)in_window, (unsigned long long)after);
  fflush(stdout);   /* a fork child leaves with _exit */
  return 0;
}

static int unsafe_signal(int sig) {
  sink = malloc(100);   /* the profiler starts (handler, dump thread) in the parent */
  free(sink);
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) return 3;
  if (pid == 0) _exit(unsafe(sig));   /* the dump thread did not cross fork: the child's samples take the signal */
  int st;
  if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st)) return 4;
  return WEXITSTATUS(st);
}

static int raise_and_wait(int sig) {
  sink = malloc(100);
  free(sink);
  uint64_t before = stat_of("prof.stats.dumps");
  raise(sig);
  printf("dumps %llu\n", (unsigned long long)(wait_dumps(before) - before));
  return 0;
}

/* ---- reset-race ---- */
static _Atomic(uint64_t) resized;            /* resizes done by the resizer */
static _Atomic(long) round_ready, round_stop, round_stopped, round_checked;   /* the last round at each step */

/* Each round: a new huge block (sampled: prof_sample:1), resized with realloc (mremap: its record is taken out and put
 * back around each move) until the main thread has reset the profile; then, once the main thread has looked at the
 * records (the block's record, if any, is in the table while no resize runs), freed. */
static void *resizer(void *arg) {
  long rounds = (long)(intptr_t)arg;
  for (long r = 1; r <= rounds; r++) {
    void *p = malloc(4u << 20);
    if (!p) abort();
    memset(p, 1, 4u << 20);   /* resident pages: each mremap has page tables to move or unmap (a wider window) */
    atomic_store(&round_ready, r);
    for (uint64_t i = 0; atomic_load(&round_stop) < r; i++) {
      void *q = realloc(p, (i & 1) ? (4u << 20) : (8u << 20));
      if (!q) abort();
      p = q;
      atomic_fetch_add(&resized, 1);
    }
    atomic_store(&round_stopped, r);
    while (atomic_load(&round_checked) < r) sched_yield();
    free(p);
  }
  return NULL;
}

static int reset_race(long rounds) {
  sink = malloc(4u << 20);
  uint64_t live0 = stat_of("prof.stats.live");   /* 1: huge blocks are sampled and followed */
  free(sink);
  pthread_t t;
  if (pthread_create(&t, NULL, resizer, (void *)(intptr_t)rounds) != 0) return 3;
  long bad = 0;
  uint64_t seed = 1;
  for (long r = 1; r <= rounds; r++) {
    while (atomic_load(&round_ready) < r) sched_yield();
    uint64_t c0 = atomic_load(&resized);
    while (atomic_load(&resized) < c0 + 1) sched_yield();   /* the resizer is in its loop */
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    for (volatile unsigned k = (unsigned)(seed >> 51); k; k--) {}   /* 0..8191 spins: the reset meets it anywhere */
    if (ctl("prof.reset", NULL, NULL, NULL, 0) != 0) return 3;
    atomic_store(&round_stop, r);
    while (atomic_load(&round_stopped) < r) sched_yield();   /* a resize under way at the reset has ended */
    bad += stat_of("prof.stats.live") != 0;   /* the reset forgot the block: it may not be followed again */
    atomic_store(&round_checked, r);
  }
  pthread_join(t, NULL);
  printf("live0 %llu bad %ld\n", (unsigned long long)live0, bad);
  return 0;
}

int main(int argc, char **argv) {
  ctl = (ctl_fn)dlsym(RTLD_DEFAULT, "mallard_ctl");
  if (!ctl) { fprintf(stderr, "mallard_ctl not found: run with libmallard preloaded\n"); return 2; }
  if (argc == 4 && !strcmp(argv[1], "blocks")) return blocks(strtoull(argv[2], NULL, 0), strtol(argv[3], NULL, 0));
  if (argc == 3 && !strcmp(argv[1], "raise")) return raise_and_wait(atoi(argv[2]));
  if (argc == 2 && !strcmp(argv[1], "unsafe-interval")) return unsafe(0);
  if (argc == 3 && !strcmp(argv[1], "unsafe-signal")) return unsafe_signal(atoi(argv[2]));
  if (argc == 3 && !strcmp(argv[1], "reset-race")) return reset_race(strtol(argv[2], NULL, 0));
  fprintf(stderr, "usage: dumps blocks SIZE COUNT | raise SIG | unsafe-interval | unsafe-signal SIG | "
                  "reset-race ROUNDS\n");
  return 2;
}
