/* test_musl_static.c — a static musl program linked with libmallard.a (musl builds only): musl's own malloc is not
 * in the program at all (libmallard.a defines every name of the family, so no member of libc.a that defines one is
 * pulled in: no duplicate symbol, no second allocator), and the allocations musl makes inside libc through its
 * internal names (__libc_malloc & co.: locales, atexit's handler blocks, spawn file actions, memory streams) are
 * Mallard's blocks. */
#include "mtest.h"
#include <locale.h>
#include <spawn.h>
#include <fcntl.h>

/* Weak references pull nothing in: non-NULL only if a member of musl's libc.a that defines them was linked for
 * another reason. __libc_malloc_impl: mallocng (strong) or the bump allocator (weak); __malloc_context: mallocng's
 * state; __malloc_donate: the loader's gifts to mallocng. */
extern const char __libc_malloc_impl[] __attribute__((weak));
extern const char __malloc_context[] __attribute__((weak));
extern const char __malloc_donate[] __attribute__((weak));

/* musl's internal entry points: a static link resolves them to libmallard.a's definitions (aliases of mallard_*). */
void *__libc_malloc(size_t n);
void *__libc_calloc(size_t n, size_t size);
void *__libc_realloc(void *p, size_t n);
void __libc_free(void *p);

static int ran;
static void handler(void) { ran++; }

int main(void) {
  CHECK(!__libc_malloc_impl && !__malloc_context && !__malloc_donate,
        "musl's malloc is linked in (__libc_malloc_impl %p, __malloc_context %p, __malloc_donate %p)",
        (const void *)__libc_malloc_impl, (const void *)__malloc_context, (const void *)__malloc_donate);
  CHECK((void *)__libc_malloc == (void *)mallard_malloc && (void *)__libc_calloc == (void *)mallard_calloc &&
        (void *)__libc_realloc == (void *)mallard_realloc && (void *)__libc_free == (void *)mallard_free,
        "musl's internal allocation names are not Mallard's");
  CHECK((void *)malloc == (void *)mallard_malloc && (void *)free == (void *)mallard_free &&
        (void *)aligned_alloc == (void *)mallard_aligned_alloc &&
        (void *)malloc_usable_size == (void *)mallard_usable_size, "the malloc family is not Mallard's");

  /* A locale object of its own (a named LC_MESSAGES: no built-in one matches), allocated by __libc_malloc. */
  locale_t loc = newlocale(LC_ALL_MASK, "C", (locale_t)0);
  loc = loc ? newlocale(LC_MESSAGES_MASK, "mallard_TEST", loc) : loc;
  REQUIRE(loc, "newlocale");
  CHECK(MT_OWNS(loc), "musl's locale object %p is not Mallard's", (void *)loc);
  locale_t dup = duplocale(loc);
  REQUIRE(dup, "duplocale");
  CHECK(MT_OWNS(dup), "musl's duplicated locale %p is not Mallard's", (void *)dup);
  freelocale(dup);   /* __libc_free */
  freelocale(loc);

  /* atexit keeps 32 handlers in place; more take blocks from __libc_calloc. */
  for (int i = 0; i < 100; i++) REQUIRE(atexit(handler) == 0, "atexit %d", i);

  /* posix_spawn file actions: __libc_malloc per action, __libc_free at destroy. */
  posix_spawn_file_actions_t fa;
  REQUIRE(posix_spawn_file_actions_init(&fa) == 0, "file actions");
  for (int i = 0; i < 50; i++)
    REQUIRE(posix_spawn_file_actions_addopen(&fa, 3, "/dev/null", O_RDONLY, 0) == 0, "addopen %d", i);
  posix_spawn_file_actions_destroy(&fa);

  /* A memory stream grows its buffer with realloc; the program frees it. */
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  REQUIRE(f, "open_memstream");
  for (int i = 0; i < 20000; i++) fprintf(f, "%d,", i);
  fclose(f);
  CHECK(buf && len > 100000 && MT_OWNS(buf), "open_memstream's buffer (%zu bytes) is not Mallard's", len);
  free(buf);
  return mt_result("test_musl_static");
}
