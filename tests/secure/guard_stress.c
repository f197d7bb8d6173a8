/* guard_stress.c — sampled guarded allocations under threads: blocks (many guarded, at a high rate and with few slots
 * so that slots are reused all the time) are handed between threads through a shared table and checked and freed
 * by whichever thread takes them (cross-thread frees), some grown by realloc; a fork in the middle must allocate in
 * the child (not under ThreadSanitizer). Prefixed API (mallard-prefix / mallard-secure-prefix); run under ThreadSanitizer by the tsan build.
 * A watchdog turns a hang into a failure that says where every thread and the forked child wait. */
#include "mtest.h"
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>

/* Nearly one allocation in eight guarded, 16 slots: the pool is full and recycled constantly. */
const char *mallard_conf = "guard_sample:512,guard_slots:16";

#define NTHREADS 4
#define ITERS 20000
#define TABLE 64
static _Atomic(void *) table[TABLE];

/* What the watchdog reports: each worker's iteration, the forks begun, the child being waited for. */
static _Atomic(int) progress[NTHREADS];
static _Atomic(int) forks_begun, child_pid, finished;

typedef struct { uint64_t size, tag; } hdr_t;   /* a block's first bytes; the rest holds the tag's byte */

static void *make(mt_rng_t *rng) {
  size_t size = 16 + mt_rng_next(rng) % 5000;   /* about four in five fit a guarded slot (<= 4096 bytes) */
  uint8_t *p = M_calloc(1, size);
  REQUIRE(p, "calloc(%zu) failed", size);
  for (size_t i = sizeof(hdr_t); i < size; i++) CHECK(!p[i], "calloc'd byte %zu of %zu not zero", i, size);
  hdr_t h = { size, mt_rng_next(rng) };
  memcpy(p, &h, sizeof h);
  memset(p + sizeof h, (int)(h.tag & 0xff), size - sizeof h);
  return p;
}

static void check_and_free(uint8_t *p) {
  hdr_t h;
  memcpy(&h, p, sizeof h);
  CHECK(h.size >= 16 && h.size < 16 + 5000 * 2, "bad header size %llu", (unsigned long long)h.size);
  CHECK(M_usable(p) >= h.size, "usable %zu < %llu", M_usable(p), (unsigned long long)h.size);
  for (size_t i = sizeof h; i < h.size; i++)
    if (p[i] != (uint8_t)(h.tag & 0xff)) { CHECK(0, "byte %zu of a %llu-byte block changed", i, (unsigned long long)h.size); break; }
  M_free(p);
}

static void *grow(uint8_t *p) {
  hdr_t h;
  memcpy(&h, p, sizeof h);
  size_t to = h.size + 100;
  uint8_t *q = M_realloc(p, to);
  REQUIRE(q, "realloc failed");
  memset(q + h.size, (int)(h.tag & 0xff), to - h.size);
  h.size = to;
  memcpy(q, &h, sizeof h);
  return q;
}

static void *worker(void *arg) {
  mt_rng_t rng;
  mt_rng_seed(&rng, (uintptr_t)arg);
  for (int i = 0; i < ITERS; i++) {
    atomic_store_explicit(&progress[(uintptr_t)arg - 1], i, memory_order_relaxed);
    void *p = make(&rng);
    if (mt_rng_next(&rng) % 4 == 0) p = grow(p);
    void *old = atomic_exchange(&table[mt_rng_next(&rng) % TABLE], p);   /* another thread's block, usually */
    if (old) check_and_free(old);
  }
  return NULL;
}

/* A fork while the others run: the child allocates (guarded too) and frees. */
static void *forker(void *arg) {
  (void)arg;
  for (int k = 0; k < 3; k++) {
    atomic_fetch_add(&forks_begun, 1);
    pid_t pid = fork();
    REQUIRE(pid >= 0, "fork failed");
    if (pid == 0) {
      mt_rng_t rng;
      mt_rng_seed(&rng, 7);
      for (int i = 0; i < 2000; i++) check_and_free(make(&rng));
      _exit(atomic_load(&mt_failures) ? 1 : 0);
    }
    int st = 0;
    atomic_store(&child_pid, pid);
    waitpid(pid, &st, 0);
    atomic_store(&child_pid, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %d", st);
  }
  return NULL;
}

/* ---- the watchdog: no allocation and no stdio (a thread may hang holding any lock) ---- */
#ifndef WATCHDOG_S
#define WATCHDOG_S 240   /* the whole test takes seconds, under qemu and ThreadSanitizer too; ctest stops it at 300 */
#endif

static void say(const char *s) { ssize_t w = write(2, s, strlen(s)); (void)w; }
/* One /proc file's first line (at most 120 bytes), or "?". */
static void say_file(const char *path) {
  char b[128];
  int fd = open(path, O_RDONLY);
  ssize_t n = fd < 0 ? -1 : read(fd, b, 120);
  if (fd >= 0) close(fd);
  if (n <= 0) { say("?"); return; }
  b[n] = 0;
  for (ssize_t i = 0; i < n; i++) if (b[i] == '\n') { b[i] = 0; break; }
  say(b);
}
/* Every thread of process pid: its state line's start, kernel wait channel and system call. */
static void say_threads(long pid) {
  char dir[64], path[128];
  snprintf(dir, sizeof dir, "/proc/%ld/task", pid);
  int fd = open(dir, O_RDONLY | O_DIRECTORY);
  if (fd < 0) { say("  (no "); say(dir); say(")\n"); return; }
  char buf[4096];
  long n;
  while ((n = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0) {
    for (long off = 0; off < n;) {
      struct { uint64_t ino; int64_t off; unsigned short reclen; unsigned char type; char name[]; } *d = (void *)(buf + off);
      off += d->reclen;
      if (d->name[0] == '.') continue;
      say("  thread "); say(d->name); say(": stat ");
      snprintf(path, sizeof path, "%s/%s/stat", dir, d->name); say_file(path);
      say(" | wchan ");
      snprintf(path, sizeof path, "%s/%s/wchan", dir, d->name); say_file(path);
      say(" | syscall ");
      snprintf(path, sizeof path, "%s/%s/syscall", dir, d->name); say_file(path);
      say("\n");
    }
  }
  close(fd);
}

static void *watchdog(void *arg) {
  (void)arg;
  for (int s = 0; s < WATCHDOG_S * 10 && !atomic_load(&finished); s++) usleep(100000);
  if (atomic_load(&finished)) return NULL;
  char line[512];   /* 4 workers: under 200 bytes */
  long child = atomic_load(&child_pid);
  int n = snprintf(line, sizeof line, "FAIL guard_stress: still running after %d s; workers at iterations", WATCHDOG_S);
  for (int i = 0; i < NTHREADS; i++) n += snprintf(line + n, sizeof line - (size_t)n, " %d", atomic_load(&progress[i]));
  snprintf(line + n, sizeof line - (size_t)n, " of %d; forks begun %d; waiting for child %ld\nthis process (%ld):\n",
           ITERS, atomic_load(&forks_begun), child, (long)getpid());
  say(line);
  say_threads(getpid());
  if (child > 0) {
    say("the child:\n");
    say_threads(child);
    kill((pid_t)child, SIGKILL);
  }
  _exit(1);
}

int main(void) {
  pthread_t t[NTHREADS], f, w;
  REQUIRE(!pthread_create(&w, NULL, watchdog, NULL), "create");
  for (uintptr_t i = 0; i < NTHREADS; i++) pthread_create(&t[i], NULL, worker, (void *)(i + 1));
  /* ThreadSanitizer does not support fork in a multi-threaded process: guard_sample_tsan.sh sets GUARD_STRESS_NO_FORK */
  bool forking = !getenv("GUARD_STRESS_NO_FORK");
  if (forking) pthread_create(&f, NULL, forker, NULL);
  for (int i = 0; i < NTHREADS; i++) pthread_join(t[i], NULL);
  if (forking) pthread_join(f, NULL);
  atomic_store(&finished, 1);
  pthread_join(w, NULL);
  for (int i = 0; i < TABLE; i++) {
    void *p = atomic_exchange(&table[i], NULL);
    if (p) check_and_free(p);
  }
  uint64_t samples = 0, live = 1, reports = 1;
  size_t len = sizeof samples;
  CHECK(MT_CTL("stats.guard.samples", &samples, &len, NULL, 0) == 0, "stats.guard.samples");
  CHECK(MT_CTL("stats.guard.live", &live, &len, NULL, 0) == 0, "stats.guard.live");
  CHECK(MT_CTL("stats.guard.reports", &reports, &len, NULL, 0) == 0, "stats.guard.reports");
  CHECK(samples > 1000, "only %llu guarded samples", (unsigned long long)samples);
  CHECK(live == 0, "%llu guarded blocks still counted live", (unsigned long long)live);
  CHECK(reports == 0, "%llu reports", (unsigned long long)reports);
  printf("guarded samples %llu\n", (unsigned long long)samples);
  return mt_result("guard_stress");
}
