/* test_prof_safety.c — heap profiling at a sample on (nearly) every allocation (prof_sample:1): samples inside dlopen,
 * during fork (an atfork handler that allocates), in TLS destructors, in a thread's first allocation, from many threads
 * at once, and through realloc / aligned / calloc paths, must neither deadlock nor recurse, and blocks stay correct. */
#include "mtest.h"
#include <pthread.h>
#include <sys/wait.h>

static uint64_t ctl_u64(const char *name) {
  uint64_t v = 0;
  size_t l = sizeof v;
  int r = MT_CTL(name, &v, &l, NULL, 0);
  CHECK(r == 0, "%s: %d", name, r);
  return v;
}

/* Every byte of a block is written and read back: a sampled block (a large block) must be a real, usable block. */
static void *filled(size_t n, unsigned char tag) {
  unsigned char *p = M_malloc(n);
  REQUIRE(p, "malloc(%zu)", n);
  memset(p, tag, n);
  return p;
}

static void check_fill(const unsigned char *p, size_t n, unsigned char tag) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != tag) { CHECK(0, "byte %zu of %zu: %d, want %d", i, n, p[i], tag); return; }
}

static void test_paths(void) {
  for (size_t n = 1; n < 70000; n = n * 3 + 1) {
    unsigned char *p = filled(n, 0x5a);
    CHECK(M_usable(p) >= n, "usable %zu < %zu", M_usable(p), n);
    unsigned char *q = M_realloc(p, n * 2);
    REQUIRE(q, "realloc");
    check_fill(q, n, 0x5a);
    q = M_realloc(q, n / 2 + 1);
    REQUIRE(q, "realloc shrink");
    check_fill(q, n / 2 + 1, 0x5a);
    M_free(q);
    unsigned char *z = M_calloc(n, 1);
    REQUIRE(z, "calloc");
    check_fill(z, n, 0);
    M_free(z);
    void *a = M_aligned_alloc(4096, n);
    REQUIRE(a && ((uintptr_t)a & 4095) == 0, "aligned_alloc");
    M_free(a);
  }
  /* huge blocks, moved by realloc (mremap): the record follows the block */
  unsigned char *h = filled(3 << 20, 7);
  h = M_realloc(h, 9 << 20);
  REQUIRE(h, "huge realloc");
  check_fill(h, 3 << 20, 7);
  M_free(h);
}

/* ---- threads: first allocation, TLS destructors ---- */
static pthread_key_t key;
static void destructor(void *v) {
  M_free(v);
  void *again = filled(100, 3);   /* an allocation in a TLS destructor, sampled */
  M_free(again);
}

static void *worker(void *arg) {
  (void)arg;
  void *first = M_malloc(24);      /* the thread's first allocation: the countdown is initialised and sampled */
  REQUIRE(first, "first");
  pthread_setspecific(key, filled(64, 1));
  void *blocks[64];
  for (int round = 0; round < 50; round++) {
    for (int i = 0; i < 64; i++) blocks[i] = filled((size_t)(16 + i * 40), (unsigned char)i);
    for (int i = 0; i < 64; i++) { check_fill(blocks[i], (size_t)(16 + i * 40), (unsigned char)i); M_free(blocks[i]); }
  }
  M_free(first);
  return NULL;
}

static void test_threads(void) {
  pthread_key_create(&key, destructor);
  for (int batch = 0; batch < 4; batch++) {
    pthread_t t[8];
    for (int i = 0; i < 8; i++) REQUIRE(pthread_create(&t[i], NULL, worker, NULL) == 0, "pthread_create");
    for (int i = 0; i < 8; i++) pthread_join(t[i], NULL);
  }
}

/* ---- fork: a prepare handler that allocates (a sample while fork runs), and a child that samples at once ---- */
static void *held;
static void prepare(void) { held = filled(200, 9); }
static void parent(void) { M_free(held); }
static void child(void) { M_free(held); }

static _Atomic(bool) stop;
static void *sampler(void *arg) {
  (void)arg;
  while (!atomic_load(&stop)) {
    void *p = M_malloc(48);
    M_free(p);
  }
  return NULL;
}

__attribute__((unused)) static void test_fork(void) {
  pthread_atfork(prepare, parent, child);
  /* other threads sample all the time: at some fork one of them holds the profiler's lock, which must not stay
   * held in the child (its first sample would wait for ever) */
  pthread_t t[3];
  for (int i = 0; i < 3; i++) REQUIRE(pthread_create(&t[i], NULL, sampler, NULL) == 0, "pthread_create");
  for (int i = 0; i < 300; i++) {
    pid_t pid = fork();
    REQUIRE(pid >= 0, "fork");
    if (pid == 0) {
      for (int k = 0; k < 20; k++) M_free(filled(5000, 2));
      if (i < 3) worker(NULL);
      _exit(0);
    }
    int status;
    REQUIRE(waitpid(pid, &status, 0) == pid, "waitpid");
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
  }
  atomic_store(&stop, true);
  for (int i = 0; i < 3; i++) pthread_join(t[i], NULL);
}

/* ---- dlopen: the loader allocates while it maps (samples there cannot load the unwinder); a library's constructor
 * allocates too (the loader is consistent again then) ---- */
static void test_dlopen(void) {
  const char *libs[] = { "libm.so.6", "libz.so.1", "libresolv.so.2", "libutil.so.1" };
  for (size_t i = 0; i < sizeof libs / sizeof libs[0]; i++) {
    void *h = dlopen(libs[i], RTLD_NOW | RTLD_LOCAL);
    if (h) dlclose(h);
  }
}

int main(void) {
  /* Sampling starts (prof_active:false at start-up) right before a dlopen: the first samples happen inside the
   * loader, where the unwinder cannot be loaded yet (a nested dlopen fails glibc's consistency assertion). */
  bool on = true;
  REQUIRE(MT_CTL("prof.active", NULL, NULL, &on, sizeof on) == 0, "prof.active");
  test_dlopen();
  test_paths();
  test_threads();
#if defined(__SANITIZE_THREAD__)
  puts("fork part not run under ThreadSanitizer (it cannot start threads after a multi-threaded fork); the static "
       "and preload builds run it");
#else
  test_fork();
#endif
  test_dlopen();
  uint64_t samples = ctl_u64("prof.stats.samples"), stacks = ctl_u64("prof.stats.stacks");
  CHECK(samples > 10000, "samples %llu: prof_sample:1 should sample nearly every allocation", (unsigned long long)samples);
  CHECK(stacks > 1, "stacks %llu", (unsigned long long)stacks);
  CHECK(ctl_u64("prof.stats.metadata") > 0, "metadata");
  return mt_result("prof_safety");
}
