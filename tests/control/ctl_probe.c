/* ctl_probe.c — a probe program for the control tests: prints options, exercises mallard_ctl, runs tiny workloads. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "mallard.h"

#ifdef PROBE_DEFINES_CONF
/* The program's own configuration string: lowest priority of the three sources. */
const char *mallard_conf = "narenas:3,dirty_decay_ms:777,page_cache:9";
#endif

static int failures;
#define CHECK(cond, ...) do { if (!(cond)) { failures++; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)

static void print_opts(void) {
  unsigned u; long l; bool b; size_t z; const char *s; size_t len;
  len = sizeof u; mallard_ctl("opt.narenas", &u, &len, NULL, 0); printf("narenas=%u\n", u);
  len = sizeof l; mallard_ctl("opt.dirty_decay_ms", &l, &len, NULL, 0); printf("dirty_decay_ms=%ld\n", l);
  len = sizeof b; mallard_ctl("opt.background_thread", &b, &len, NULL, 0); printf("background_thread=%d\n", b);
  len = sizeof b; mallard_ctl("opt.retain", &b, &len, NULL, 0); printf("retain=%d\n", b);
  len = sizeof s; mallard_ctl("opt.thp", &s, &len, NULL, 0); printf("thp=%s\n", s);
  len = sizeof b; mallard_ctl("opt.verbose", &b, &len, NULL, 0); printf("verbose=%d\n", b);
  len = sizeof b; mallard_ctl("opt.abort_conf", &b, &len, NULL, 0); printf("abort_conf=%d\n", b);
  len = sizeof b; mallard_ctl("opt.stats_print", &b, &len, NULL, 0); printf("stats_print=%d\n", b);
  len = sizeof s; mallard_ctl("opt.stats_print_opts", &s, &len, NULL, 0); printf("stats_print_opts=%s\n", s);
  len = sizeof u; mallard_ctl("opt.page_cache", &u, &len, NULL, 0); printf("page_cache=%u\n", u);
  len = sizeof z; mallard_ctl("opt.huge_cache_max", &z, &len, NULL, 0); printf("huge_cache_max=%zu\n", z);
  len = sizeof b; mallard_ctl("opt.zero_on_free", &b, &len, NULL, 0); printf("zero_on_free=%d\n", b);
  len = sizeof u; mallard_ctl("opt.guard_slab_interval", &u, &len, NULL, 0); printf("guard_slab_interval=%u\n", u);
  len = sizeof z; mallard_ctl("opt.secure_noaccess_min", &z, &len, NULL, 0); printf("secure_noaccess_min=%zu\n", z);
  len = sizeof u; mallard_ctl("opt.large_quarantine", &u, &len, NULL, 0); printf("large_quarantine=%u\n", u);
  len = sizeof b; mallard_ctl("opt.delayed_reuse", &b, &len, NULL, 0); printf("delayed_reuse=%d\n", b);
  len = sizeof u; mallard_ctl("opt.shuffle", &u, &len, NULL, 0); printf("shuffle=%u\n", u);
  len = sizeof s; mallard_ctl("opt.junk", &s, &len, NULL, 0); printf("junk=%s\n", s);
  unsigned n; len = sizeof n; mallard_ctl("arenas.nclasses", &n, &len, NULL, 0);
  for (unsigned c = 0; c < n; c++) {
    char name[64]; size_t sz, pb;
    snprintf(name, sizeof name, "stats.classes.%u.size", c); len = sizeof sz; mallard_ctl(name, &sz, &len, NULL, 0);
    snprintf(name, sizeof name, "opt.slab_sizes.%u", c); len = sizeof pb; mallard_ctl(name, &pb, &len, NULL, 0);
    printf("slab.%zu=%zu\n", sz, pb);
  }
}

static unsigned class_of(size_t size) {
  unsigned n; size_t len = sizeof n;
  mallard_ctl("arenas.nclasses", &n, &len, NULL, 0);
  for (unsigned c = 0; c < n; c++) {
    char name[64]; size_t sz; len = sizeof sz;
    snprintf(name, sizeof name, "stats.classes.%u.size", c);
    mallard_ctl(name, &sz, &len, NULL, 0);
    if (sz >= size) return c;
  }
  return n;
}

static uint64_t class_stat(unsigned c, const char *field) {
  char name[96]; uint64_t v = 0; size_t len = sizeof v;
  snprintf(name, sizeof name, "stats.classes.%u.%s", c, field);
  int r = mallard_ctl(name, &v, &len, NULL, 0);
  CHECK(r == 0, "%s -> %d", name, r);
  return v;
}

/* Every ctl name: readable ones read, writable ones written, errors where they must be. */
static void ctl_all(void) {
  size_t len;
  const char *ver; len = sizeof ver;
  CHECK(mallard_ctl("version", &ver, &len, NULL, 0) == 0 && !strcmp(ver, MALLARD_VERSION), "version");
  CHECK(mallard_ctl("version", NULL, NULL, &ver, sizeof ver) == EPERM, "version is read-only");
  uint64_t e, e2 = 1; len = sizeof e;
  CHECK(mallard_ctl("epoch", &e, &len, NULL, 0) == 0, "epoch read");
  CHECK(mallard_ctl("epoch", NULL, NULL, &e2, sizeof e2) == 0, "epoch write");
  uint64_t e3; len = sizeof e3;
  CHECK(mallard_ctl("epoch", &e3, &len, NULL, 0) == 0 && e3 > e, "epoch advances");
  CHECK(mallard_ctl("epoch", NULL, NULL, &e2, 3) == EINVAL, "epoch wrong length");
  CHECK(mallard_ctl("no.such.name", NULL, NULL, NULL, 0) == ENOENT, "unknown name");
  CHECK(mallard_ctl("opt.nosuch", NULL, NULL, NULL, 0) == ENOENT, "unknown opt");
  unsigned u; len = 1;
  CHECK(mallard_ctl("opt.narenas", &u, &len, NULL, 0) == EINVAL, "wrong oldlen");
  CHECK(mallard_ctl("opt.narenas", NULL, NULL, &u, sizeof u) == EPERM, "opt read-only");
  CHECK(mallard_ctl(NULL, NULL, NULL, NULL, 0) == EINVAL, "NULL name");
  /* Everything is validated before anything changes: a bad oldlenp leaves the epoch and the binding alone. */
  uint64_t e4, e5; size_t badlen = 3; len = sizeof e4;
  mallard_ctl("epoch", &e4, &len, NULL, 0);
  CHECK(mallard_ctl("epoch", &e5, &badlen, &e2, sizeof e2) == EINVAL, "epoch with a bad oldlenp");
  mallard_ctl("epoch", &e5, &len, NULL, 0);
  CHECK(e5 == e4, "a refused epoch write advanced the epoch (%llu -> %llu)", (unsigned long long)e4,
        (unsigned long long)e5);
  CHECK(mallard_ctl("epoch", &e5, NULL, &e2, sizeof e2) == EINVAL, "epoch with oldp but no oldlenp");
  mallard_ctl("epoch", &e5, &len, NULL, 0);
  CHECK(e5 == e4, "an epoch write without oldlenp advanced the epoch");
  CHECK(mallard_ctl("epoch", NULL, NULL, NULL, sizeof e2) == EINVAL, "epoch: newp NULL with a non-zero newlen");
  unsigned ar0, ar1, created; len = sizeof ar0;
  CHECK(mallard_ctl("thread.arena", &ar0, &len, NULL, 0) == 0, "thread.arena read");
  len = sizeof created;
  CHECK(mallard_ctl("arenas.create", &created, &len, NULL, 0) == 0, "arenas.create");
  CHECK(mallard_ctl("thread.arena", &ar1, &badlen, &created, sizeof created) == EINVAL, "thread.arena bad oldlenp");
  len = sizeof ar1;
  mallard_ctl("thread.arena", &ar1, &len, NULL, 0);
  CHECK(ar1 == ar0, "a refused thread.arena write moved the thread (%u -> %u)", ar0, ar1);
  CHECK(mallard_ctl("thread.arena", NULL, NULL, NULL, sizeof(unsigned)) == EINVAL,
        "thread.arena: newp NULL with a non-zero newlen");
  CHECK(mallard_ctl("opt.narenas", NULL, NULL, NULL, 4) == EINVAL, "opt: newp NULL with a non-zero newlen");
  CHECK(mallard_ctl("arenas.narenas", NULL, NULL, NULL, 4) == EINVAL, "arenas.narenas: newp NULL, newlen 4");
  const char *stats[] = { "stats.allocated", "stats.active", "stats.resident", "stats.mapped", "stats.retained",
                          "stats.metadata", "stats.dirty" };
  void *keep = mallard_malloc(5 << 20);
  void *small = mallard_malloc(100);
  for (size_t i = 0; i < sizeof stats / sizeof *stats; i++) {
    size_t v = 0; len = sizeof v;
    CHECK(mallard_ctl(stats[i], &v, &len, NULL, 0) == 0, "%s", stats[i]);
    CHECK(mallard_ctl(stats[i], NULL, NULL, &v, sizeof v) == EPERM, "%s read-only", stats[i]);
  }
  size_t alloc, active, mapped, meta; len = sizeof alloc;
  mallard_ctl("stats.allocated", &alloc, &len, NULL, 0);
  mallard_ctl("stats.active", &active, &len, NULL, 0);
  mallard_ctl("stats.mapped", &mapped, &len, NULL, 0);
  mallard_ctl("stats.metadata", &meta, &len, NULL, 0);
  CHECK(alloc >= (5u << 20) + 100, "allocated %zu counts the blocks", alloc);
  CHECK(active >= alloc && mapped >= active && meta > 0, "active %zu >= allocated, mapped %zu >= active", active, mapped);
  unsigned na; len = sizeof na;
  CHECK(mallard_ctl("arenas.narenas", &na, &len, NULL, 0) == 0 && na >= 1, "arenas.narenas");
  const char *afields[] = { "nthreads", "segments", "dirty_bytes", "purged_bytes", "large_active", "npurge_passes",
                            "nmadvise", "mutex.ops", "mutex.contended", "mutex.wait_ns" };
  for (size_t i = 0; i < sizeof afields / sizeof *afields; i++) {
    char name[80]; snprintf(name, sizeof name, "stats.arenas.0.%s", afields[i]);
    if (i == 0) { unsigned v; len = sizeof v; CHECK(mallard_ctl(name, &v, &len, NULL, 0) == 0 && v >= 1, "%s", name); }
    else { uint64_t v; len = sizeof v; CHECK(mallard_ctl(name, &v, &len, NULL, 0) == 0, "%s", name); }
  }
  uint64_t v; len = sizeof v;
  CHECK(mallard_ctl("stats.arenas.999.segments", &v, &len, NULL, 0) == ENOENT, "arena out of range");
  CHECK(mallard_ctl("stats.classes.999.nmalloc", &v, &len, NULL, 0) == ENOENT, "class out of range");
  CHECK(mallard_ctl("arena.0.purge", NULL, NULL, NULL, 0) == 0, "arena.0.purge");
  CHECK(mallard_ctl("arena.0.decay", NULL, NULL, NULL, 0) == 0, "arena.0.decay");
  CHECK(mallard_ctl("arena.999.purge", NULL, NULL, NULL, 0) == ENOENT, "arena.999.purge");
  CHECK(mallard_ctl("arena.0.purge", &v, &len, NULL, 0) == EINVAL, "purge takes no value");
  CHECK(mallard_ctl("thread.tcache.flush", NULL, NULL, NULL, 0) == 0, "thread.tcache.flush");
  uint64_t a0, d0, a1, d1; len = sizeof a0;
  mallard_ctl("thread.allocated", &a0, &len, NULL, 0);
  mallard_ctl("thread.deallocated", &d0, &len, NULL, 0);
  void *p = mallard_malloc(1000);
  mallard_free(p);
  mallard_ctl("thread.allocated", &a1, &len, NULL, 0);
  mallard_ctl("thread.deallocated", &d1, &len, NULL, 0);
  CHECK(a1 - a0 >= 1000 && d1 - d0 >= 1000, "thread.allocated/deallocated move by the block (%llu, %llu)",
        (unsigned long long)(a1 - a0), (unsigned long long)(d1 - d0));
  CHECK(mallard_ctl("thread.allocated", NULL, NULL, &a1, sizeof a1) == EPERM, "thread.allocated read-only");
  bool bt; len = sizeof bt;
  CHECK(mallard_ctl("background_thread", &bt, &len, NULL, 0) == 0, "background_thread");
  mallard_free(keep);
  mallard_free(small);
}

/* A thread bound to a new arena allocates from it. */
static void *bound_thread(void *arg) {
  unsigned idx = *(unsigned *)arg, cur; size_t len = sizeof cur;
  CHECK(mallard_ctl("thread.arena", NULL, NULL, &idx, sizeof idx) == 0, "bind");
  CHECK(mallard_ctl("thread.arena", &cur, &len, NULL, 0) == 0 && cur == idx, "thread.arena reads %u", cur);
  char name[80]; uint64_t segs, large; len = sizeof segs;
  snprintf(name, sizeof name, "stats.arenas.%u.segments", idx);
  mallard_ctl(name, &segs, &len, NULL, 0);
  CHECK(segs == 0, "new arena starts empty (%llu)", (unsigned long long)segs);
  void *p = mallard_malloc(64), *q = mallard_malloc(1 << 20);
  mallard_ctl(name, &segs, &len, NULL, 0);
  snprintf(name, sizeof name, "stats.arenas.%u.large_active", idx);
  mallard_ctl(name, &large, &len, NULL, 0);
  CHECK(segs >= 1, "the bound arena now has segments (%llu)", (unsigned long long)segs);
  CHECK(large >= (1 << 20), "the large block is in the bound arena (%llu)", (unsigned long long)large);
  unsigned nt; len = sizeof nt;
  snprintf(name, sizeof name, "stats.arenas.%u.nthreads", idx);
  mallard_ctl(name, &nt, &len, NULL, 0);
  CHECK(nt == 1, "one thread on the new arena (%u)", nt);
  CHECK(mallard_ctl("thread.arena", NULL, NULL, &(unsigned){ 9999 }, sizeof(unsigned)) == EINVAL, "bind to missing arena");
  mallard_free(p);
  mallard_free(q);
  return NULL;
}

static void bind_test(void) {
  unsigned idx, before, after, opt0, opt1; size_t len = sizeof idx;
  mallard_ctl("arenas.narenas", &before, &len, NULL, 0);
  mallard_ctl("opt.narenas", &opt0, &len, NULL, 0);
  CHECK(mallard_ctl("arenas.create", &idx, &len, NULL, 0) == 0, "arenas.create");
  mallard_ctl("arenas.narenas", &after, &len, NULL, 0);
  mallard_ctl("opt.narenas", &opt1, &len, NULL, 0);
  CHECK(idx == before && after == before + 1, "created arena %u (narenas %u -> %u)", idx, before, after);
  CHECK(opt1 == opt0, "opt.narenas is the option, not the arena count (%u -> %u after arenas.create)", opt0, opt1);
  pthread_t t;
  pthread_create(&t, NULL, bound_thread, &idx);
  pthread_join(t, NULL);
}

/* After 1000 malloc(100) and 400 free, the 112-byte class shows exactly those counts. */
static void exact_test(void) {
  unsigned c = class_of(100);
  uint64_t m0 = class_stat(c, "nmalloc"), f0 = class_stat(c, "nfree"), cur0 = class_stat(c, "curobjs");
  void *ps[1000];
  for (int i = 0; i < 1000; i++) ps[i] = mallard_malloc(100);
  for (int i = 0; i < 400; i++) mallard_free(ps[i]);
  uint64_t m = class_stat(c, "nmalloc") - m0, f = class_stat(c, "nfree") - f0, cur = class_stat(c, "curobjs") - cur0;
  printf("class=%u size=%llu nmalloc=%llu nfree=%llu curobjs=%llu nrequests=%llu objs_per_page=%llu\n", c,
         (unsigned long long)class_stat(c, "size"), (unsigned long long)m, (unsigned long long)f,
         (unsigned long long)cur, (unsigned long long)class_stat(c, "nrequests"),
         (unsigned long long)class_stat(c, "objs_per_page"));
  CHECK(m == 1000 && f == 400 && cur == 600, "exact counts");
  for (int i = 400; i < 1000; i++) mallard_free(ps[i]);
}

static void write_stdout(void *opaque, const char *s) { (void)opaque; fputs(s, stdout); }

/* reopen2 PATH: started with fd 2 closed, the program's first open() becomes its fd 2; it writes one line there. */
static int reopen2(const char *path) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return 3;
  void *p = mallard_malloc(100);   /* the allocator is in use */
  mallard_free(p);
  return write(fd, "program output\n", 15) == 15 ? 0 : 4;
}

/* daemon PIDFILE: the child detaches (its stdio on /dev/null) and lingers; the parent exits at once. */
static int daemon_child(const char *pidfile) {
  void *p = mallard_malloc(100);
  mallard_free(p);
  pid_t pid = fork();
  if (pid < 0) return 3;
  if (pid == 0) {
    int null = open("/dev/null", O_RDWR);
    for (int fd = 0; fd < 3; fd++) dup2(null, fd);
    if (null > 2) close(null);
    setsid();
    sleep(60);   /* the test kills it long before */
    _exit(0);
  }
  FILE *f = fopen(pidfile, "w");
  if (!f) return 4;
  fprintf(f, "%d\n", (int)pid);
  fclose(f);
  printf("parent done\n");
  return 0;
}

/* stdout N: N lines to stdout through stdio, flushed only by exit(). */
static int many_lines(const char *n) {
  long lines = strtol(n, NULL, 10);
  for (long i = 0; i < lines; i++) printf("line %ld\n", i);
  return 0;
}

int main(int argc, char **argv) {
  const char *cmd = argc > 1 ? argv[1] : "";
  if (!strcmp(cmd, "opts")) print_opts();
  else if (!strcmp(cmd, "ctl")) ctl_all();
  else if (!strcmp(cmd, "bind")) bind_test();
  else if (!strcmp(cmd, "exact")) exact_test();
  else if (!strcmp(cmd, "reopen2") && argc > 2) return reopen2(argv[2]);
  else if (!strcmp(cmd, "daemon") && argc > 2) return daemon_child(argv[2]);
  else if (!strcmp(cmd, "stdout") && argc > 2) return many_lines(argv[2]);
  else if (!strcmp(cmd, "json") || !strcmp(cmd, "text")) {
    void *ps[500];
    for (int i = 0; i < 500; i++) ps[i] = mallard_malloc((size_t)(i % 50) * 40 + 1);
    for (int i = 0; i < 500; i += 2) mallard_free(ps[i]);
    mallard_stats_print(write_stdout, NULL, !strcmp(cmd, "json") ? "J" : "");
  } else {
    fprintf(stderr, "usage: ctl_probe opts|ctl|bind|exact|json|text|reopen2 PATH|daemon PIDFILE|stdout N\n");
    return 2;
  }
  if (failures) fprintf(stderr, "%d check(s) failed\n", failures);
  return failures ? 1 : 0;
}
