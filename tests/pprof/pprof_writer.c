/* pprof_writer.c — drives mld_pprof_write with synthetic samples whose pcs are real return addresses in this
 * program's known functions; tests/pprof/test_pprof_writer.py checks the files with go tool pprof, gzip and Python.
 *
 *   pprof-writer basic OUT        known stacks and values; prints the return addresses and expected totals
 *   pprof-writer many OUT N       N samples over a pool of stacks (buffer and table growth); prints the totals
 *   pprof-writer deep OUT         one 128-frame stack (real recursion) and one 128-frame synthetic stack
 *   pprof-writer file PATH        mld_pprof_write_file: all or nothing (checks a failing write leaves nothing)
 *   pprof-writer pipe OUT         the "many" profile through a slow pipe with signals interrupting write(2):
 *                                 the bytes must equal a direct write's
 *   pprof-writer errors           EINVAL, EBADF, ENOSPC, ENAMETOOLONG, ENOENT; ENOMEM under a small RLIMIT_AS
 */
#define _GNU_SOURCE
#include "prof/pprof.h"
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#define RA() ((uintptr_t)__builtin_return_address(0))
#define BARRIER() __asm__ volatile("" ::: "memory")   /* code after a call: no tail call, the frame stays */
#define CHECK(c)                                                                     \
  do {                                                                               \
    if (!(c)) {                                                                      \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c);          \
      exit(1);                                                                       \
    }                                                                                \
  } while (0)

/* Return addresses captured in known functions: ra_in_X lies inside X (it is where a callee of X returns to). */
uintptr_t ra_in_beta, ra_in_gamma, ra_in_main, ra_in_static;
__attribute__((noinline)) void pprof_test_alpha(void) { ra_in_beta = RA(); BARRIER(); }
__attribute__((noinline)) void pprof_test_beta(void) { pprof_test_alpha(); BARRIER(); ra_in_gamma = RA(); BARRIER(); }
__attribute__((noinline)) void pprof_test_gamma(void) { pprof_test_beta(); BARRIER(); }
/* Exported neighbour, then a function with no dynamic symbol: dladdr's nearest symbol for a pc in the static
 * function may be the neighbour, which is no correct name. */
__attribute__((noinline)) void pprof_test_neighbour(void) { ra_in_static = RA(); BARRIER(); }
__attribute__((noinline)) static void hidden_static_function(void) { pprof_test_neighbour(); BARRIER(); }
void (*volatile hidden_fn)(void) = hidden_static_function;
/* An exported function symbol without a size (assembly without .size): dladdr answers it for any address above it
 * (up to the next symbol), but its extent is unknown, so it names nothing. */
__asm__(".text\n.globl pprof_test_nosize\n.type pprof_test_nosize, @function\npprof_test_nosize:\n"
        "  ret\n  .fill 64, 1, 0x90\n");
void pprof_test_nosize(void);

/* Recursion: each level records its return address (all inside pprof_test_recurse but the outermost). */
__attribute__((noinline)) void pprof_test_recurse(int n, uintptr_t *out) {
  out[n] = RA();
  if (n > 0) pprof_test_recurse(n - 1, out);
  BARRIER();
}

/* ---- sample sources ---- */
typedef struct { const mld_pprof_sample_t *v; size_t n, i; } list_t;
static bool list_next(void *ctx, mld_pprof_sample_t *out) {
  list_t *l = ctx;
  if (l->i == l->n) return false;
  *out = l->v[l->i++];
  return true;
}

/* "many": sample i has stack pool[i % 97 ...] and values derived from i; a pc pool of distinct addresses. */
typedef struct { size_t n, i; uintptr_t stack[8]; int64_t tot[4]; const uintptr_t *pool; size_t npool; } many_t;
static bool many_next(void *ctx, mld_pprof_sample_t *out) {
  many_t *m = ctx;
  if (m->i == m->n) return false;
  size_t i = m->i++;
  uint32_t depth = 1 + (uint32_t)(i % 8);
  for (uint32_t k = 0; k < depth; k++) m->stack[k] = m->pool[(i * 31 + k * 7919) % m->npool];
  out->pcs = m->stack;
  out->depth = depth;
  out->alloc_objects = 1 + (int64_t)(i % 7);
  out->alloc_space = 64 * (int64_t)(i % 13 + 1);
  out->inuse_objects = (int64_t)(i % 3);
  out->inuse_space = 16 * (int64_t)(i % 5);
  return true;
}

static size_t make_pool(uintptr_t **pool) {
  /* 20000 distinct pcs: the known return addresses, then addresses through this program's code and libc's. */
  size_t n = 20000;
  uintptr_t *p = calloc(n, sizeof *p);
  CHECK(p);
  p[0] = ra_in_beta;
  p[1] = ra_in_gamma;
  p[2] = ra_in_main;
  for (size_t k = 3; k < n; k++) p[k] = (k % 2 ? (uintptr_t)&pprof_test_alpha : (uintptr_t)&write) + 1 + k;
  *pool = p;
  return n;
}

static void many_run(many_t *m, size_t n, const uintptr_t *pool, size_t npool) {
  memset(m, 0, sizeof *m);
  m->n = n;
  m->pool = pool;
  m->npool = npool;
}

static int write_path(const char *path, mld_pprof_next_fn next, void *ctx) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  CHECK(fd >= 0);
  mld_pprof_info_t info = {.time_nanos = 1700000000123456789LL, .duration_nanos = 2500000000LL, .period = 524288};
  int e = mld_pprof_write(fd, &info, next, ctx);
  close(fd);
  return e;
}

static int cmp_pc(const void *a, const void *b) {
  uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
  return x < y ? -1 : x > y;
}

/* Distinct nonzero pcs of the "many" stacks, counted by sorting (the writer's table must agree). */
static size_t distinct_pcs(size_t n, const uintptr_t *pool, size_t npool) {
  uintptr_t *all = calloc(n * 8, sizeof *all);
  CHECK(all);
  size_t c = 0;
  for (size_t i = 0; i < n; i++)
    for (uint32_t k = 0; k < 1 + (uint32_t)(i % 8); k++) all[c++] = pool[(i * 31 + k * 7919) % npool];
  qsort(all, c, sizeof *all, cmp_pc);
  size_t d = 0;
  for (size_t i = 0; i < c; i++) d += all[i] && (i == 0 || all[i] != all[i - 1]);
  free(all);
  return d;
}

static void totals(many_t *m) {
  /* recount from the same rule, independently of what the writer saw */
  for (size_t i = 0; i < m->n; i++) {
    m->tot[0] += 1 + (int64_t)(i % 7);
    m->tot[1] += 64 * (int64_t)(i % 13 + 1);
    m->tot[2] += (int64_t)(i % 3);
    m->tot[3] += 16 * (int64_t)(i % 5);
  }
  printf("total alloc_objects=%lld alloc_space=%lld inuse_objects=%lld inuse_space=%lld\n", (long long)m->tot[0],
         (long long)m->tot[1], (long long)m->tot[2], (long long)m->tot[3]);
}

static volatile sig_atomic_t alarms;
static void on_alarm(int sig) { (void)sig; alarms++; }

static bool fail_next(void *ctx, mld_pprof_sample_t *out) {   /* one good sample, then an invalid one */
  int *k = ctx;
  memset(out, 0, sizeof *out);
  out->depth = (*k)++ ? 3 : 0;   /* the second: depth 3, pcs NULL */
  return *k <= 2;
}

int main(int argc, char **argv) {
  CHECK(argc >= 2);
  pprof_test_gamma();
  hidden_fn();
  ra_in_main = RA();   /* inside main's caller (libc): a frame outside this program */
  const char *mode = argv[1];
  if (!strcmp(mode, "basic")) {
    CHECK(argc == 3);
    uintptr_t s1[] = {ra_in_beta, ra_in_gamma, ra_in_main};
    uintptr_t s2[] = {ra_in_gamma, 0, ra_in_main};   /* pc 0 is dropped */
    uintptr_t s3[] = {ra_in_static, ra_in_main};
    /* glibc's dladdr answers the size-0 symbol for its own address (pc - 1 == symbol), not for addresses above */
    uintptr_t s4[] = {(uintptr_t)&pprof_test_nosize + 1, (uintptr_t)&pprof_test_nosize + 33};
    mld_pprof_sample_t v[] = {
        {s1, 3, 10, 10240, 4, 4096},
        {s2, 3, 3, 3000, 1, 1000},
        {s3, 2, 7, 700, 0, 0},
        {s1, 0, 1, 1, 1, 1},   /* no frames at all */
        {s4, 2, 5, 50, 0, 0},
    };
    list_t l = {v, 5, 0};
    CHECK(write_path(argv[2], list_next, &l) == 0);
    printf("ra_in_beta=%#lx\nra_in_gamma=%#lx\nra_in_main=%#lx\nra_in_static=%#lx\n", (unsigned long)ra_in_beta,
           (unsigned long)ra_in_gamma, (unsigned long)ra_in_main, (unsigned long)ra_in_static);
    printf("nosize=%#lx\n", (unsigned long)&pprof_test_nosize);
    printf("alpha=%#lx\nbeta=%#lx\ngamma=%#lx\nneighbour=%#lx\nhidden=%#lx\n", (unsigned long)&pprof_test_alpha,
           (unsigned long)&pprof_test_beta, (unsigned long)&pprof_test_gamma, (unsigned long)&pprof_test_neighbour,
           (unsigned long)&hidden_static_function);
    return 0;
  }
  if (!strcmp(mode, "many")) {
    CHECK(argc == 4);
    uintptr_t *pool;
    size_t np = make_pool(&pool);
    many_t m;
    many_run(&m, strtoul(argv[3], NULL, 10), pool, np);
    CHECK(write_path(argv[2], many_next, &m) == 0);
    CHECK(m.i == m.n);
    totals(&m);
    printf("distinct_pcs=%zu\n", distinct_pcs(m.n, pool, np));
    free(pool);
    return 0;
  }
  if (!strcmp(mode, "deep")) {
    CHECK(argc == 3);
    uintptr_t rec[128], syn[128];
    pprof_test_recurse(127, rec);
    /* innermost first: rec[0] is the deepest level's return address */
    for (int k = 0; k < 128; k++) syn[k] = (uintptr_t)&pprof_test_recurse + 1 + (uintptr_t)k;
    mld_pprof_sample_t v[] = {{rec, 128, 1, 128, 1, 128}, {syn, 128, 2, 256, 2, 256}};
    list_t l = {v, 2, 0};
    CHECK(write_path(argv[2], list_next, &l) == 0);
    printf("recurse=%#lx\n", (unsigned long)&pprof_test_recurse);
    return 0;
  }
  if (!strcmp(mode, "file")) {
    CHECK(argc == 3);
    mld_pprof_info_t info = {.period = 4096};
    uintptr_t s1[] = {ra_in_beta, ra_in_gamma};
    mld_pprof_sample_t v[] = {{s1, 2, 1, 100, 1, 100}};
    list_t l = {v, 1, 0};
    CHECK(mld_pprof_write_file(argv[2], &info, list_next, &l) == 0);
    int k = 0;   /* a failing write leaves the finished file as it was, and no temporary file */
    CHECK(mld_pprof_write_file(argv[2], &info, fail_next, &k) == EINVAL);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", argv[2], (int)getpid());
    CHECK(access(tmp, F_OK) != 0 && errno == ENOENT);
    printf("ok\n");
    return 0;
  }
  if (!strcmp(mode, "pipe")) {
    CHECK(argc == 3);
    uintptr_t *pool;
    size_t np = make_pool(&pool);
    many_t m;
    many_run(&m, 30000, pool, np);
    char direct[4200];
    snprintf(direct, sizeof direct, "%s.direct", argv[2]);
    CHECK(write_path(direct, many_next, &m) == 0);
    int pfd[2];
    CHECK(pipe(pfd) == 0);
    pid_t child = fork();
    CHECK(child >= 0);
    if (child == 0) {   /* a slow reader: small reads with pauses, into OUT */
      close(pfd[1]);
      int out = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC, 0644);
      char buf[1000];
      ssize_t r;
      while ((r = read(pfd[0], buf, sizeof buf)) != 0) {
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 || write(out, buf, (size_t)r) != r) _exit(2);
        usleep(20);
      }
      _exit(close(out) == 0 ? 0 : 3);
    }
    close(pfd[0]);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;   /* no SA_RESTART: write(2) returns EINTR or a short count */
    CHECK(sigaction(SIGALRM, &sa, NULL) == 0);
    struct itimerval it = {{0, 100}, {0, 100}};
    CHECK(setitimer(ITIMER_REAL, &it, NULL) == 0);
    many_run(&m, 30000, pool, np);
    mld_pprof_info_t info = {.time_nanos = 1700000000123456789LL, .duration_nanos = 2500000000LL, .period = 524288};
    int e = mld_pprof_write(pfd[1], &info, many_next, &m);
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    CHECK(e == 0);
    close(pfd[1]);
    int st;
    while (waitpid(child, &st, 0) < 0) CHECK(errno == EINTR);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    printf("alarms=%d\n", (int)alarms);
    free(pool);
    return 0;
  }
  if (!strcmp(mode, "errors")) {
    mld_pprof_info_t info = {.period = 1};
    uintptr_t s1[] = {ra_in_beta};
    mld_pprof_sample_t v[] = {{s1, 1, 1, 1, 1, 1}};
    list_t l = {v, 1, 0};
    int devnull = open("/dev/null", O_WRONLY);
    CHECK(mld_pprof_write(devnull, NULL, list_next, &l) == EINVAL);
    CHECK(mld_pprof_write(devnull, &info, NULL, &l) == EINVAL);
    int k = 0;
    CHECK(mld_pprof_write(devnull, &info, fail_next, &k) == EINVAL);
    l.i = 0;
    CHECK(mld_pprof_write(-1, &info, list_next, &l) == EBADF);
    int full = open("/dev/full", O_WRONLY);
    if (full >= 0) {
      l.i = 0;
      CHECK(mld_pprof_write(full, &info, list_next, &l) == ENOSPC);
    }
    char longp[5000];
    memset(longp, 'a', sizeof longp - 1);
    longp[sizeof longp - 1] = 0;
    l.i = 0;
    CHECK(mld_pprof_write_file(longp, &info, list_next, &l) == ENAMETOOLONG);
    l.i = 0;
    CHECK(mld_pprof_write_file("/nonexistent-dir-mallard/x.pb.gz", &info, list_next, &l) == ENOENT);
    /* ENOMEM: address space capped a little above today's; 400k distinct pcs need far more tables than that. */
    static uintptr_t big[400000];
    for (size_t i = 0; i < 400000; i++) big[i] = (uintptr_t)&write + 1 + i;
    many_t m;
    many_run(&m, 400000, big, 400000);
    FILE *f = fopen("/proc/self/statm", "r");
    CHECK(f);
    unsigned long pages = 0;
    CHECK(fscanf(f, "%lu", &pages) == 1);
    fclose(f);
    /* Each child caps its address space at today's size plus 0, 16 KiB, ... 4 MiB, so that the first mapping to
     * fail is a different one each time (a fresh map, a table growth, an mremap): ENOMEM every time, no crash. */
    for (unsigned long extra = 0; extra <= 1024; extra += 4) {
      pid_t c = fork();
      CHECK(c >= 0);
      if (c == 0) {
        struct rlimit rl = {(pages + extra) * 4096, RLIM_INFINITY};
        if (setrlimit(RLIMIT_AS, &rl) != 0) _exit(3);
        _exit(mld_pprof_write(devnull, &info, many_next, &m) == ENOMEM ? 0 : 4);
      }
      int st;
      CHECK(waitpid(c, &st, 0) == c);
      if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "headroom %lu pages: %s %d\n", extra, WIFEXITED(st) ? "exit" : "signal",
                WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
        return 1;
      }
    }
    printf("ok\n");
    return 0;
  }
  fprintf(stderr, "unknown mode %s\n", mode);
  return 2;
}
