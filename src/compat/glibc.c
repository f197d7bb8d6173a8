/* compat/glibc.c — glibc's malloc introspection and tuning (mallinfo2, mallinfo, malloc_stats, malloc_info, mallopt) answered with Mallard's figures. */
#define _GNU_SOURCE
#include "core/core.h"
#include "control/control.h"
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* glibc's parameter numbers (malloc.h); named here so that the mapping reads the same with any libc headers. */
enum { GL_M_MXFAST = 1, GL_M_TRIM_THRESHOLD = -1, GL_M_TOP_PAD = -2, GL_M_MMAP_THRESHOLD = -3, GL_M_MMAP_MAX = -4,
       GL_M_CHECK_ACTION = -5, GL_M_PERTURB = -6, GL_M_ARENA_TEST = -7, GL_M_ARENA_MAX = -8 };
#define GL_MAX_FAST_SIZE 160   /* glibc's MAX_FAST_SIZE on 64-bit (80 * sizeof(size_t) / 4): M_MXFAST's upper bound */

/* Only the replacing libraries define these names: the prefixed library leaves glibc's own to glibc. */
#ifdef MALLARD_OVERRIDE
#ifdef __GLIBC__
#include <malloc.h>
typedef struct mallinfo2 gl_mallinfo2_t;
typedef struct mallinfo gl_mallinfo_t;
#else
/* musl declares none of these calls: the same names with glibc's layouts, for programs ported from glibc that
 * declare them themselves (docs/COMPATIBILITY.md, "musl"). */
typedef struct {
  size_t arena, ordblks, smblks, hblks, hblkhd, usmblks, fsmblks, uordblks, fordblks, keepcost;
} gl_mallinfo2_t;
typedef struct {
  int arena, ordblks, smblks, hblks, hblkhd, usmblks, fsmblks, uordblks, fordblks, keepcost;
} gl_mallinfo_t;
#endif
/* The figures every glibc call reports, from one snapshot. */
typedef struct glibc_view_s {
  size_t mapped, allocated, dirty, huge_count, huge_bytes;
} glibc_view_t;

static void view(glibc_view_t *v) {
  mld_ensure_init();
  global_stats_t g;
  heap_stats_t hs;
  mld_global_stats(&g);
  mld_stats_sum(&hs);
  v->mapped = (size_t)g.mapped;
  v->allocated = (size_t)g.allocated;
  v->dirty = (size_t)g.dirty;
  v->huge_count = (size_t)(hs.huge_nmalloc >= hs.huge_nfree ? hs.huge_nmalloc - hs.huge_nfree : 0);
  v->huge_bytes = (size_t)atomic_load(&mld_huge_active);
  /* The counters are read one after another while other threads run: keep the derived figures non-negative. */
  if (v->mapped < v->allocated) v->mapped = v->allocated;
}

/* arena: everything mapped (huge blocks included, unlike glibc, where they are only in hblkhd); uordblks: bytes
 * allocated; fordblks: the rest of the mapping; keepcost: dirty bytes (what malloc_trim would give back). */
static void fill2(gl_mallinfo2_t *m) {
  glibc_view_t v;
  view(&v);
  memset(m, 0, sizeof *m);
  m->arena = v.mapped;
  m->hblks = v.huge_count;
  m->hblkhd = v.huge_bytes;
  m->uordblks = v.allocated;
  m->fordblks = v.mapped - v.allocated;
  m->keepcost = v.dirty;
}

#define GL_EXPORT __attribute__((visibility("default")))

GL_EXPORT gl_mallinfo2_t mallinfo2(void) {
  gl_mallinfo2_t m;
  fill2(&m);
  return m;
}

/* glibc's int fields wrap past 2 GiB; Mallard saturates at INT_MAX instead, so that a large heap never reads
 * as a small or negative one. */
static int sat(size_t x) { return x > (size_t)INT_MAX ? INT_MAX : (int)x; }

GL_EXPORT gl_mallinfo_t mallinfo(void) {
  gl_mallinfo2_t m2;
  fill2(&m2);
  gl_mallinfo_t m;
  m.arena = sat(m2.arena);
  m.ordblks = sat(m2.ordblks);
  m.smblks = sat(m2.smblks);
  m.hblks = sat(m2.hblks);
  m.hblkhd = sat(m2.hblkhd);
  m.usmblks = sat(m2.usmblks);
  m.fsmblks = sat(m2.fsmblks);
  m.uordblks = sat(m2.uordblks);
  m.fordblks = sat(m2.fordblks);
  m.keepcost = sat(m2.keepcost);
  return m;
}

/* glibc's layout, on stderr: the totals only (Mallard's arenas do not keep per-arena "in use" bytes). Written with
 * write(2) from a stack buffer: it never allocates. */
GL_EXPORT void malloc_stats(void) {
  glibc_view_t v;
  view(&v);
  char buf[512];
  int n = snprintf(buf, sizeof buf,
                   "Total (incl. mmap):\nsystem bytes     = %10zu\nin use bytes     = %10zu\n"
                   "max mmap regions = %10zu\nmax mmap bytes   = %10zu\n",
                   v.mapped, v.allocated, v.huge_count, v.huge_bytes);
  if (n <= 0) return;
  size_t len = (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1;
  for (size_t off = 0; off < len;) {
    ssize_t w = write(2, buf + off, len - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    off += (size_t)w;
  }
}

/* glibc's XML schema (<malloc version="1">, one <heap> per arena, then the totals), with Mallard's figures:
 * "rest" is free, not yet purged memory (dirty), "mmap" the huge blocks, "current" what is mapped. */
GL_EXPORT int malloc_info(int options, FILE *fp) {
  if (options != 0 || !fp) return EINVAL;   /* glibc returns EINVAL (not -1) for options != 0 */
  glibc_view_t v;
  view(&v);
  fprintf(fp, "<malloc version=\"1\">\n");
  unsigned n = atomic_load(&mld_narenas);
  for (unsigned i = 0; i < n; i++) {
    arena_snapshot_t a;
    if (!mld_arena_snapshot(i, &a)) continue;
    uint64_t seg_bytes = a.nsegments * (uint64_t)MLD_SEGMENT_SIZE;
    fprintf(fp, "<heap nr=\"%u\">\n<sizes>\n</sizes>\n<total type=\"fast\" count=\"0\" size=\"0\"/>\n"
                "<total type=\"rest\" count=\"0\" size=\"%llu\"/>\n<system type=\"current\" size=\"%llu\"/>\n"
                "<system type=\"max\" size=\"%llu\"/>\n<aspace type=\"total\" size=\"%llu\"/>\n"
                "<aspace type=\"mprotect\" size=\"%llu\"/>\n</heap>\n",
            i, (unsigned long long)a.dirty_bytes, (unsigned long long)seg_bytes, (unsigned long long)seg_bytes,
            (unsigned long long)seg_bytes, (unsigned long long)seg_bytes);
  }
  fprintf(fp, "<total type=\"fast\" count=\"0\" size=\"0\"/>\n<total type=\"rest\" count=\"0\" size=\"%zu\"/>\n"
              "<total type=\"mmap\" count=\"%zu\" size=\"%zu\"/>\n<system type=\"current\" size=\"%zu\"/>\n"
              "<system type=\"max\" size=\"%zu\"/>\n<aspace type=\"total\" size=\"%zu\"/>\n"
              "<aspace type=\"mprotect\" size=\"%zu\"/>\n</malloc>\n",
          v.dirty, v.huge_count, v.huge_bytes, v.mapped, v.mapped, v.mapped, v.mapped);
  return 0;
}

/* glibc 2.36's answers: 1 for every parameter, known or not, whatever the value, except M_MXFAST outside
 * 0..MAX_FAST_SIZE (0). M_ARENA_MAX > 0 caps the arenas threads spread over (values above Mallard's 64 arenas cap
 * at 64; 0 or less is ignored, as glibc ignores it). The other parameters tune glibc's own heap and have no
 * counterpart: accepted, no effect (docs/COMPAT.md). */
GL_EXPORT int mallopt(int param, int value) {
  if (param == GL_M_MXFAST) return value >= 0 && value <= GL_MAX_FAST_SIZE;
  if (param == GL_M_ARENA_MAX && value > 0) {
    mld_ensure_init();
    atomic_store(&mld_arena_cap, value > MLD_MAX_ARENAS ? (unsigned)MLD_MAX_ARENAS : (unsigned)value);
  }
  return 1;
}
#endif
