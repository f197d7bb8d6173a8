/* test_foreign.c — free/realloc/malloc_usable_size of pointers Mallard did not hand out: reported once, no damage. */
#include "mtest.h"
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>

extern char **environ;

#define KiB ((size_t)1024)
#define MiB ((size_t)1024 * 1024)

#ifndef MT_PRELOAD
/* Static links (prefix and static modes) reach the allocator's hidden counter of invalid pointers. */
extern _Atomic(uint64_t) mld_invalid_count;
#define INVALID_COUNT() atomic_load(&mld_invalid_count)
#else
#define INVALID_COUNT() ((uint64_t)0)
#endif

static uint8_t static_array[4096] __attribute__((aligned(64)));

/* Hand one foreign pointer to free, realloc and malloc_usable_size; each call must be refused (and counted). */
static int nforeign;
static void poke_w(void *p, const char *what, bool interior) {
  uint64_t before = INVALID_COUNT();
  M_free(p);
  errno = 0;
  void *r = M_realloc(p, 100);
  CHECK(r == NULL, "realloc(%s) = %p, want NULL", what, r);
  CHECK(errno == ENOMEM, "realloc(%s): errno %d, want ENOMEM", what, errno);
  size_t u = M_usable(p);
  CHECK(u == 0, "malloc_usable_size(%s) = %zu, want 0", what, u);
  nforeign += 3;
#ifndef MT_PRELOAD
  CHECK(INVALID_COUNT() == before + 3, "%s: %llu of 3 calls were recognised as invalid", what,
        (unsigned long long)(INVALID_COUNT() - before));
#else
  (void)before;
#endif
  /* mallard_owns() answers "points into memory Mallard handed out": true inside a block, false elsewhere. */
  if (!interior) CHECK(!MT_OWNS(p), "mallard_owns(%s) is true", what);
}
#define poke(p, what) poke_w(p, what, false)
#define poke_interior(p, what) poke_w(p, what, true)

/* The allocator still works after the reports: a burst of blocks of many sizes, patterns intact. */
static void still_works(void) {
  enum { N = 2000 };
  static void *b[N];
  for (int i = 0; i < N; i++) {
    size_t n = (size_t)(i % 50) * 97 + (i % 200 == 0 ? 300 * KiB : 0);
    b[i] = M_malloc(n);
    REQUIRE(b[i], "malloc(%zu) after foreign frees", n);
    mt_fill(b[i], n, (uint64_t)i);
  }
  for (int i = 0; i < N; i++) {
    size_t n = (size_t)(i % 50) * 97 + (i % 200 == 0 ? 300 * KiB : 0);
    CHECK(mt_verify(b[i], n, (uint64_t)i) == n, "block %d damaged", i);
    M_free(b[i]);
  }
}

static int child(void) {
  /* A stack address, a static array, an mmap'd page: contents must stay as they were. */
  uint8_t stack_buf[256];
  mt_fill(stack_buf, sizeof stack_buf, 1);
  poke(stack_buf + 16, "stack address");
  CHECK(mt_verify(stack_buf, sizeof stack_buf, 1) == sizeof stack_buf, "stack buffer modified");

  mt_fill(static_array, sizeof static_array, 2);
  poke(static_array, "static array");
  poke(static_array + 1024, "static array + 1024");
  CHECK(mt_verify(static_array, sizeof static_array, 2) == sizeof static_array, "static array modified");

  uint8_t *page = mmap(NULL, 4 * MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(page != MAP_FAILED, "mmap");
  mt_fill(page, 8192, 3);
  poke(page, "mmap'd page");
  poke(page + 4096, "mmap'd page + 4096");
  CHECK(mt_verify(page, 8192, 3) == 8192, "mmap'd page modified");
  /* A 4 MiB-aligned foreign mapping looks like a segment start: only the ownership map can tell. */
  uint8_t *seg_like = (uint8_t *)(((uintptr_t)page + 4 * MiB - 1) & ~(uintptr_t)(4 * MiB - 1));
  if (seg_like < page + 4 * MiB) poke(seg_like, "4 MiB-aligned foreign address");
  munmap(page, 4 * MiB);

  /* Interior pointers of Mallard's own large and huge blocks: refused, and the block stays usable. */
  uint8_t *large = M_malloc(700 * KiB);
  REQUIRE(large, "malloc(700K)");
  mt_fill(large, 700 * KiB, 4);
  poke_interior(large + 16, "large block + 16");
  poke_interior(large + 64 * KiB, "large block + 64K");
  poke_interior(large + 300 * KiB + 48, "large block + 300K");
  CHECK(mt_verify(large, 700 * KiB, 4) == 700 * KiB, "large block damaged by interior frees");
  CHECK(M_usable(large) >= 700 * KiB, "large block usable size changed");
  uint8_t *huge = M_malloc(9 * MiB);
  REQUIRE(huge, "malloc(9M)");
  mt_fill(huge, 9 * MiB, 5);
  poke_interior(huge + 4096, "huge block + 4096");
  poke_interior(huge + 5 * MiB, "huge block + 5M");
  CHECK(mt_verify(huge, 9 * MiB, 5) == 9 * MiB, "huge block damaged by interior frees");

  /* A block of the real glibc malloc, found through dlopen("libc.so.6"), whatever malloc the program uses (musl
   * answers that name with itself: its own malloc). A static musl program cannot dlopen, and its libc.a's malloc is
   * not linked in at all (libmallard.a defines the whole family): no such block there. */
  void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  if (!libc) libc = dlopen("libc.so.6", RTLD_NOW);
#if !defined(__GLIBC__) && defined(MT_STATIC)
  if (!libc) {
    M_free(large);
    M_free(huge);
    still_works();
    printf("child: %d foreign calls survived (static musl: no libc malloc to test)\n", nforeign);
    printf("CHILD-OK\n");
    fflush(stdout);
    return atomic_load(&mt_failures) ? 1 : 0;
  }
#endif
  REQUIRE(libc, "dlopen(libc.so.6): %s", dlerror());
  void *(*glibc_malloc)(size_t) = (void *(*)(size_t))dlsym(libc, "malloc");
  REQUIRE(glibc_malloc, "dlsym(libc, malloc)");
  uint8_t *g = glibc_malloc(200);
  REQUIRE(g, "glibc malloc");
  mt_fill(g, 200, 6);
  poke(g, "glibc malloc block");
  CHECK(mt_verify(g, 200, 6) == 200, "glibc block modified");
  void *(*glibc_libc_malloc)(size_t) = (void *(*)(size_t))dlsym(libc, "__libc_malloc");
  if (glibc_libc_malloc) {   /* glibc's own internal name, as some programs call it */
    uint8_t *g2 = glibc_libc_malloc(48);
    REQUIRE(g2, "glibc __libc_malloc");
    mt_fill(g2, 48, 8);
    poke(g2, "glibc __libc_malloc block");
    CHECK(mt_verify(g2, 48, 8) == 48, "glibc __libc_malloc block modified");
  }
  /* Large glibc blocks are mmap'd by glibc: another kind of foreign address. */
  uint8_t *gbig = glibc_malloc(1 * MiB);
  REQUIRE(gbig, "glibc malloc(1M)");
  poke(gbig, "glibc mmap'd block");

  M_free(large);
  M_free(huge);
  still_works();
  printf("child: %d foreign calls survived\n", nforeign);
  printf("CHILD-OK\n");
  fflush(stdout);
  return atomic_load(&mt_failures) ? 1 : 0;
}

/* Read everything from fd into buf (NUL-terminated). */
static size_t slurp(int fd, char *buf, size_t cap) {
  size_t n = 0;
  for (;;) {
    ssize_t r = read(fd, buf + n, cap - 1 - n);
    if (r <= 0) break;
    n += (size_t)r;
    if (n == cap - 1) break;
  }
  buf[n] = 0;
  return n;
}

static size_t count(const char *s, const char *needle) {
  size_t n = 0;
  for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle)) n++;
  return n;
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "child")) return child();

  /* Parent: run the child with stdout and stderr captured, then check what it said. */
  int out[2], err[2];
  REQUIRE(pipe(out) == 0 && pipe(err) == 0, "pipe");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err[1], 2);
  posix_spawn_file_actions_addclose(&fa, out[0]);
  posix_spawn_file_actions_addclose(&fa, err[0]);
  char *args[] = { argv[0], "child", NULL };
  pid_t pid;
  int rc = posix_spawn(&pid, "/proc/self/exe", &fa, NULL, args, environ);
  REQUIRE(rc == 0, "posix_spawn: %s", strerror(rc));
  posix_spawn_file_actions_destroy(&fa);
  close(out[1]);
  close(err[1]);
  static char obuf[65536], ebuf[65536];
  slurp(err[0], ebuf, sizeof ebuf);   /* the child writes little: reading one pipe then the other cannot block */
  slurp(out[0], obuf, sizeof obuf);
  int st;
  waitpid(pid, &st, 0);
  printf("--- child stdout ---\n%s--- child stderr ---\n%s--------------------\n", obuf, ebuf);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %#x (signal %d)", st, WIFSIGNALED(st) ? WTERMSIG(st) : 0);
  CHECK(strstr(obuf, "CHILD-OK") != NULL, "child did not finish");
  size_t reports = count(ebuf, "not allocated by mallard");
  CHECK(reports == 1, "foreign pointers reported %zu times on stderr, want exactly once", reports);
  CHECK(count(ebuf, "mallard: free(") == 1, "the single report must name the first call, free()");
  CHECK(count(ebuf, "mallard:") == 1, "other mallard messages on stderr");
  CHECK(strstr(ebuf, "FAIL") == NULL, "child checks failed");
  return mt_result("test_foreign (" MT_MODE ")");
}
