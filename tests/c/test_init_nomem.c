/* test_init_nomem.c — mmap failing from the very start (initialisation included): every call fails cleanly with
 * ENOMEM, and once memory is back the allocator works (item 6; the first heap used to dereference a missing arena).
 * Static link mode with `-Wl,--wrap=mmap`: libmallard.a's mmap calls come here, the C library's do not. */
#include "mtest.h"
#include <pthread.h>
#include <sys/mman.h>
#include <sys/wait.h>

void *__real_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off);

static _Atomic(long) mmap_calls;
static _Atomic(long) succeed_first = -1;   /* -1: every call succeeds; N >= 0: N calls succeed, then all fail */

void *__wrap_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
  long k = atomic_fetch_add(&mmap_calls, 1);
  long n = atomic_load(&succeed_first);
  if (n >= 0 && k >= n) { errno = ENOMEM; return MAP_FAILED; }
  return __real_mmap(addr, len, prot, flags, fd, off);
}

/* Before libmallard's own constructor (priority 101 runs before unprioritised constructors). */
__attribute__((constructor(101))) static void setup(void) {
  const char *s = getenv("MT_SUCCEED_FIRST");
  if (s) atomic_store(&succeed_first, strtol(s, NULL, 10));
}

static void *worker(void *arg) {
  (void)arg;
  void *p = M_malloc(100);
  if (p) M_free(p);
  return p;
}

/* Every entry point, while mmap fails: NULL + ENOMEM (or a block, if it needed no new memory), never a crash. */
static void while_failing(void) {
  size_t sizes[] = { 16, 200, 5000, 20000, 300000, 3u << 20, 40u << 20 };
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    errno = 0;
    void *p = M_malloc(sizes[i]);
    CHECK(p || errno == ENOMEM, "malloc(%zu) under failing mmap: NULL with errno %d", sizes[i], errno);
    if (p) { mt_fill(p, sizes[i], 3); M_free(p); }
    errno = 0;
    p = M_calloc(2, sizes[i]);
    CHECK(p || errno == ENOMEM, "calloc under failing mmap: errno %d", errno);
    M_free(p);
    errno = 0;
    p = M_aligned_alloc(1u << 16, sizes[i]);
    CHECK(p || errno == ENOMEM, "aligned_alloc under failing mmap: errno %d", errno);
    M_free(p);
  }
  pthread_t t;
  if (pthread_create(&t, NULL, worker, NULL) == 0) pthread_join(t, NULL);
}

static void after_recovery(void) {
  void *blocks[64];
  for (int i = 0; i < 64; i++) {
    size_t n = (size_t)1 << (4 + i % 22);
    blocks[i] = M_malloc(n);
    REQUIRE(blocks[i], "malloc(%zu) after memory came back", n);
    mt_fill(blocks[i], n, (uint64_t)i);
  }
  for (int i = 0; i < 64; i++) {
    size_t n = (size_t)1 << (4 + i % 22);
    CHECK(mt_verify(blocks[i], n, (uint64_t)i) == n, "block %d damaged", i);
    M_free(blocks[i]);
  }
  pthread_t t;
  void *r = NULL;
  REQUIRE(pthread_create(&t, NULL, worker, NULL) == 0, "pthread_create");
  pthread_join(t, &r);
  CHECK(r != NULL, "a new thread cannot allocate after recovery");
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "child")) {
    while_failing();
    atomic_store(&succeed_first, -1);   /* memory is back */
    after_recovery();
    return mt_result("test_init_nomem child");
  }
  /* Fresh processes: mmap fails from its N-th call on, for N = 0 (initialisation itself fails) upwards. */
  for (int n = 0; n <= 8; n++) {
    pid_t pid = fork();
    REQUIRE(pid >= 0, "fork");
    if (pid == 0) {
      char v[16];
      snprintf(v, sizeof v, "%d", n);
      setenv("MT_SUCCEED_FIRST", v, 1);
      execl("/proc/self/exe", argv[0], "child", (char *)NULL);
      _exit(127);
    }
    int st;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "mmap failing from call %d on: child %s %d", n,
          WIFSIGNALED(st) ? "killed by signal" : "exit status", WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
  }
  return mt_result("test_init_nomem[static]");
}
