/* tests/pagesize/page_size.c — the page size in force: arenas.page, the statistics, valloc/pvalloc, huge blocks and
 * the address space a program with one small allocation holds, at the kernel's page or a test build's. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "mtest.h"
#if !defined(__GLIBC__)   /* musl has no pvalloc: Mallard's, linked in or exported by the preloaded library */
#ifdef PAGE_SIZE_LINKED
void *pvalloc(size_t size);
#else
#define pvalloc(n) (((void *(*)(size_t))dlsym(RTLD_DEFAULT, "pvalloc"))(n))
#endif
#endif

typedef int (*mallctl_fn)(const char *, void *, size_t *, void *, size_t);
typedef void (*stats_fn)(void (*)(void *, const char *), void *, const char *);

static char json[1 << 16];
static size_t json_len;
static void collect(void *opaque, const char *text) {
  (void)opaque;
  size_t n = strlen(text);
  if (json_len + n < sizeof json) { memcpy(json + json_len, text, n); json_len += n; }
}

/* An opaque call: the compiler may not drop a malloc/free pair it can see. */
static void *volatile sink;

int main(void) {
  size_t page = mt_page();   /* the kernel's, or the test build's when larger */
#ifdef PAGE_SIZE_LINKED   /* libmallard.a: referenced, so linked in */
  extern int mallctl(const char *, void *, size_t *, void *, size_t);
  extern void mallard_stats_print(void (*)(void *, const char *), void *, const char *);
  mallctl_fn ctl = mallctl;
  stats_fn stats = mallard_stats_print;
#else                      /* preloaded: found in the process */
  mallctl_fn ctl = (mallctl_fn)dlsym(RTLD_DEFAULT, "mallctl");
  stats_fn stats = (stats_fn)dlsym(RTLD_DEFAULT, "mallard_stats_print");
#endif
  if (!ctl || !stats) { fprintf(stderr, "FAIL: Mallard is not the allocator (no mallctl / mallard_stats_print)\n"); return 1; }
  sink = malloc(100);   /* the one small allocation of a "sleeping" program */
  unsigned long long vm = 0;
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "VmSize:", 7)) vm = strtoull(line + 7, NULL, 10);
  if (f) fclose(f);

  size_t v = 0, l = sizeof v;
  CHECK(ctl("arenas.page", &v, &l, NULL, 0) == 0 && v == page, "arenas.page %zu, expected %zu", v, page);

  stats(collect, NULL, "J");
  char want[64];
  snprintf(want, sizeof want, "\"page_size\":%zu,", page);
  CHECK(strstr(json, want) != NULL, "statistics lack %s", want);
  const char *m = strstr(json, "\"mapped\":");
  unsigned long long mapped = m ? strtoull(m + 9, NULL, 10) : ~0ull;
  /* One 4 MiB segment, a metadata chunk and the touched owner-map page: the same few MiB at every page size. */
  CHECK(mapped <= (5ull << 20), "mapped %llu bytes after one small allocation (at most 5 MiB)", mapped);

  void *p = valloc(1);
  CHECK(p && (uintptr_t)p % page == 0, "valloc(1) = %p, not aligned to %zu", p, page);
  free(p);
  p = pvalloc(1);
  CHECK(p && (uintptr_t)p % page == 0 && malloc_usable_size(p) >= page, "pvalloc(1) = %p, usable %zu", p,
        p ? malloc_usable_size(p) : 0);
  free(p);
  for (size_t sz = 3 << 20; sz <= (24u << 20); sz += (5u << 20) + 123) {   /* huge blocks: data on a page of its own */
    p = malloc(sz);
    CHECK(p && (uintptr_t)p % page == 0 && ((uintptr_t)p & ((4u << 20) - 1)) <= 65536,
          "huge malloc(%zu) = %p: not page-aligned just past its header", sz, p);
    if (p) memset(p, 7, sz);
    sink = p;
    free(p);
  }
  printf("page %zu: after one small allocation, mapped by mallard %llu KiB, VmSize %llu KiB\n", page, mapped >> 10, vm);
  return mt_result("page_size");
}
