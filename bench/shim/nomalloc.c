/* Test shim (LD_PRELOAD): glibc's malloc, except that a thread which asked for it dies the moment it allocates. */
#define _GNU_SOURCE
#include <errno.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>

/*
 * Used by tests/bench to prove that xstorm's consumer threads never allocate: the workload calls
 * mbench_forbid_malloc_in_this_thread() (a weak reference, NULL unless this library is preloaded) at the start of
 * every consumer, and from then on any allocation entry point called by that thread - directly or from inside libc
 * (stdio, qsort, ...) - writes a message and ends the process with exit status 7. Every call is served by glibc's own
 * allocator (the exported __libc_* functions), so free() and malloc_usable_size() stay glibc's and consistent.
 */
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void *__libc_valloc(size_t);
extern void *__libc_pvalloc(size_t);

static __thread int forbidden;

__attribute__((visibility("default"))) void mbench_forbid_malloc_in_this_thread(void) { forbidden = 1; }

static void check(const char *fn) {
  if (!forbidden) return;
  static const char pre[] = "NOMALLOC: ";
  static const char post[] = " called by a thread that must not allocate\n";
  ssize_t r = write(2, pre, sizeof pre - 1);
  r = write(2, fn, strlen(fn));
  r = write(2, post, sizeof post - 1);
  (void)r;
  _exit(7);
}

__attribute__((visibility("default"))) void *malloc(size_t n) {
  check("malloc");
  return __libc_malloc(n);
}
__attribute__((visibility("default"))) void *calloc(size_t a, size_t b) {
  check("calloc");
  return __libc_calloc(a, b);
}
__attribute__((visibility("default"))) void *realloc(void *p, size_t n) {
  check("realloc");
  return __libc_realloc(p, n);
}
__attribute__((visibility("default"))) void *reallocarray(void *p, size_t a, size_t b) {
  check("reallocarray");
  size_t n;
  if (__builtin_mul_overflow(a, b, &n)) {
    errno = ENOMEM;
    return NULL;
  }
  return __libc_realloc(p, n);
}
__attribute__((visibility("default"))) void *memalign(size_t al, size_t n) {
  check("memalign");
  return __libc_memalign(al, n);
}
__attribute__((visibility("default"))) void *aligned_alloc(size_t al, size_t n) {
  check("aligned_alloc");
  return __libc_memalign(al, n);
}
__attribute__((visibility("default"))) int posix_memalign(void **out, size_t al, size_t n) {
  check("posix_memalign");
  if (al < sizeof(void *) || (al & (al - 1))) return EINVAL;
  void *p = __libc_memalign(al, n);
  if (!p && n) return ENOMEM;
  *out = p;
  return 0;
}
__attribute__((visibility("default"))) void *valloc(size_t n) {
  check("valloc");
  return __libc_valloc(n);
}
__attribute__((visibility("default"))) void *pvalloc(size_t n) {
  check("pvalloc");
  return __libc_pvalloc(n);
}
