/* test_prof_stacks.c — heap profiles hold whole stacks, not just the allocation's caller: a block allocated through
 * main -> stack_f1 -> stack_f2 -> stack_f3 -> malloc is recorded with the frames f3, f2, f1, main in that order.
 * Static mode (INTERNAL): read from the profiler's own snapshot. Preload mode: a child leaks such a block under
 * prof_leak:true, and the parent reads the names of the top site's frames from the child's report (dladdr: the
 * program is linked -rdynamic). Against glibc the unwinder is libgcc_s, loaded with dlopen; against musl it is the
 * program's own (linked with -Wl,-u,_Unwind_Backtrace), which is the route of a static musl program; with
 * MT_PROF_CALLER_ONLY, that program is linked without the frame index libgcc's unwinder needs (it would abort on its
 * first frame): Mallard must not use it, and records the caller alone. */
#include "mtest.h"
#include <sys/mman.h>
#include <sys/wait.h>

#if !defined(__GLIBC__)
#include <link.h>
/* Debian's libgcc_eh.a (built on glibc 2.36) finds unwind tables with glibc's _dl_find_object, which musl lacks:
 * the same answer from dl_iterate_phdr (the object's range and its PT_GNU_EH_FRAME), glibc's x86-64 layout. A musl
 * distribution's libgcc_eh (Alpine's) uses dl_iterate_phdr itself and never calls this. */
struct dl_find_object {
  unsigned long long dlfo_flags;
  void *dlfo_map_start, *dlfo_map_end;
  void *dlfo_link_map;
  void *dlfo_eh_frame;
  unsigned long long dlfo_reserved[7];
};
typedef struct { uintptr_t pc; struct dl_find_object *out; } find_query_t;

static int find_cb(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  find_query_t *q = arg;
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  void *eh = NULL;
  bool inside = false;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    uintptr_t a = info->dlpi_addr + ph->p_vaddr;
    if (ph->p_type == PT_LOAD) {
      if (q->pc - a < ph->p_memsz) inside = true;
      if (a < lo) lo = a;
      if (a + ph->p_memsz > hi) hi = a + ph->p_memsz;
    } else if (ph->p_type == PT_GNU_EH_FRAME) {
      eh = (void *)a;
    }
  }
  if (!inside) return 0;
  memset(q->out, 0, sizeof *q->out);
  q->out->dlfo_map_start = (void *)lo;
  q->out->dlfo_map_end = (void *)hi;
  q->out->dlfo_eh_frame = eh;
  return 1;
}

__attribute__((visibility("default"))) int _dl_find_object(void *pc, struct dl_find_object *out) {
  find_query_t q = { (uintptr_t)pc, out };
  return dl_iterate_phdr(find_cb, &q) ? 0 : -1;
}
#endif

/* The chain: each call is followed by work, so that none is a tail call; exported for dladdr's names. */
static volatile uintptr_t sink;
__attribute__((noinline, used, visibility("default"))) void *stack_f3(size_t n) {
  void *p = M_malloc(n);
  sink += (uintptr_t)p;
  return p;
}
__attribute__((noinline, used, visibility("default"))) void *stack_f2(size_t n) {
  void *p = stack_f3(n);
  sink += 2;
  return p;
}
__attribute__((noinline, used, visibility("default"))) void *stack_f1(size_t n) {
  void *p = stack_f2(n);
  sink += 1;
  return p;
}

#ifndef MT_PRELOAD
#include "prof/prof.h"

/* pc is a return address inside fn (the functions above are a few dozen bytes long). */
static bool in_fn(uintptr_t pc, const void *fn) { return pc > (uintptr_t)fn && pc - (uintptr_t)fn < 256; }

int main(void) {
  void *blocks[16];
  for (int i = 0; i < 16; i++) blocks[i] = stack_f1(1000 + (size_t)i);
  prof_snap_t *a;
  size_t bytes, n = mld_prof_snapshot(&a, &bytes);
  REQUIRE(a, "no snapshot (is MALLARD_CONF=prof:true,prof_sample:1 set?)");
  const prof_stack_t *st = NULL;
  for (size_t i = 0; i < n && !st; i++)
    if (a[i].st->depth && in_fn(a[i].st->pcs[0], (const void *)stack_f3)) st = a[i].st;
  REQUIRE(st, "no sampled stack starts in stack_f3 (%zu stacks)", n);
  printf("stack of stack_f3's malloc: %u frames\n", (unsigned)st->depth);
  if (getenv("MT_PROF_CALLER_ONLY")) {   /* an unwinder that would abort (no frame index): not used, no abort */
    CHECK(st->depth == 1, "%u frames from an unwinder without a frame index", (unsigned)st->depth);
    munmap(a, bytes);
    return mt_result("test_prof_stacks (" MT_MODE ", no frame index)");
  }
  CHECK(st->depth >= 4, "%u frame(s): the stack holds the allocation's caller only (no unwinder?)",
        (unsigned)st->depth);
  if (st->depth >= 4) {
    CHECK(in_fn(st->pcs[1], (const void *)stack_f2), "frame 1 is not in stack_f2");
    CHECK(in_fn(st->pcs[2], (const void *)stack_f1), "frame 2 is not in stack_f1");
    CHECK(st->pcs[3] > (uintptr_t)main && st->pcs[3] - (uintptr_t)main < 4096, "frame 3 is not in main");
  }
  munmap(a, bytes);
  for (int i = 0; i < 16; i++) M_free(blocks[i]);
  return mt_result("test_prof_stacks (" MT_MODE ")");
}
#else
int main(int argc, char **argv) {
  (void)argc;
  if (getenv("MT_PROF_STACKS_CHILD")) {   /* leaks 8 MiB from the chain: the top site of the report at exit */
    void *p = stack_f1(8 << 20);
    sink += (uintptr_t)p;
    return 0;
  }
  static char buf[1 << 16];
  const char *env[] = { "MT_PROF_STACKS_CHILD=1", "MALLARD_CONF=prof:true,prof_sample:1,prof_leak:true", NULL };
  int st = mt_rerun(argv[0], env, buf, sizeof buf);
  REQUIRE(st >= 0, "pipe or fork failed");
  REQUIRE(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child failed (status %d): %s", st, buf);
  /* The report's first site line (the largest): "  ~N bytes in ~M blocks: stack_f3+0x.. < stack_f2+0x.. < ..." */
  const char *site = strstr(buf, "blocks: ");
  REQUIRE(site, "no leak report from the child:\n%s", buf);
  const char *eol = strchr(site, '\n');
  const char *f3 = strstr(site, " stack_f3+"), *f2 = strstr(site, " stack_f2+"), *f1 = strstr(site, " stack_f1+");
  const char *m = strstr(site, " main+");
#ifndef __GLIBC__
  /* musl without an unwinder to share (no musl libgcc_s.so.1, as on Debian): the documented fallback, said once. */
  if (strstr(buf, "stacks hold the allocation's caller only")) {
    CHECK(f3 && (!eol || f3 < eol) && (!eol || !f2 || f2 > eol), "the fallback stack is not stack_f3 alone:\n%s", buf);
    printf("no unwinder for a dynamic musl program here: the caller alone, with the notice\n");
    printf("%.*s\n", eol ? (int)(eol - site) : (int)strlen(site), site);
    return mt_result("test_prof_stacks (" MT_MODE ")");
  }
#endif
  CHECK(f3 && f2 && f1 && m && f3 < f2 && f2 < f1 && f1 < m && (!eol || m < eol),
        "the top site is not stack_f3 < stack_f2 < stack_f1 < main:\n%s", buf);
  printf("%.*s\n", eol ? (int)(eol - site) : (int)strlen(site), site);
  return mt_result("test_prof_stacks (" MT_MODE ")");
}
#endif
