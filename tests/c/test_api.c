/* test_api.c — API conformance of the malloc family and its edge cases (prefixed, static-linked or LD_PRELOAD build). */
#include "mtest.h"
#include <stddef.h>
#include <sys/mman.h>

#define KiB ((size_t)1024)
#define MiB ((size_t)1024 * 1024)

/* Sizes handed through a volatile so the compiler neither folds nor warns about impossible requests. */
static volatile size_t vsize;
static size_t V(size_t x) { vsize = x; return vsize; }

/* Entry points glibc 2.36 does not declare (or declares only internally); resolved at run time when preloaded. */
#ifdef MT_PREFIX
#define FREE_SIZED mallard_free_sized
#define FREE_ALIGNED_SIZED mallard_free_aligned_sized
#else
void free_sized(void *p, size_t size);
void free_aligned_sized(void *p, size_t align, size_t size);
void *__libc_malloc(size_t);
void __libc_free(void *);
void *__libc_calloc(size_t, size_t);
void *__libc_realloc(void *, size_t);
void *__libc_memalign(size_t, size_t);
void *__libc_valloc(size_t);
void *__libc_pvalloc(size_t);
int __posix_memalign(void **, size_t, size_t);
#ifdef MT_PRELOAD
#define FREE_SIZED ((void (*)(void *, size_t))mt_sym("free_sized"))
#define FREE_ALIGNED_SIZED ((void (*)(void *, size_t, size_t))mt_sym("free_aligned_sized"))
#else
#define FREE_SIZED free_sized
#define FREE_ALIGNED_SIZED free_aligned_sized
#endif
#endif

static bool aligned(const void *p, size_t a) { return ((uintptr_t)p & (a - 1)) == 0; }

/* A block is good: not NULL, aligned, owned by Mallard, usable size >= n (and, if `write`, writable up to it). */
static void check_block_w(void *p, size_t n, size_t align, const char *what, bool write) {
  CHECK(p != NULL, "%s(%zu) returned NULL", what, n);
  if (!p) return;
  CHECK(aligned(p, align < 16 ? 16 : align), "%s(%zu) = %p not aligned to %zu", what, n, p, align);
  CHECK(MT_OWNS(p), "%s(%zu) = %p is not Mallard's", what, n, p);
  size_t u = M_usable(p);
  CHECK(u >= n, "%s(%zu): usable size %zu < requested", what, n, u);
  if (u >= n && write) memset(p, 0x5A, u);
}
#define check_block(p, n, align, what) check_block_w(p, n, align, what, true)
/* Checks a block whose contents the caller still needs (after a realloc). */
#define check_kept(p, n, align, what) check_block_w(p, n, align, what, false)

static void test_identity(void) {
  const char *v = NULL;
  size_t len = sizeof v;
  CHECK(MT_CTL("version", &v, &len, NULL, 0) == 0 && v && !strcmp(v, MALLARD_VERSION), "mallard_ctl(version)");
  void *p = M_malloc(10);
  CHECK(MT_OWNS(p), "the program's malloc (%s build) is not Mallard's", MT_MODE);
  M_free(p);
  CHECK(!MT_OWNS(&len), "a stack address is reported as Mallard's");
#ifndef MT_PREFIX
  /* Memory libc allocates for itself (stdio buffers, strdup) comes from Mallard too. */
  char *s = strdup("mallard");
  CHECK(s && MT_OWNS(s), "strdup's block is not Mallard's");
  free(s);
  char *line = NULL;
  CHECK(asprintf(&line, "%d", 42) == 2 && MT_OWNS(line), "asprintf's block is not Mallard's");
  free(line);
#endif
}

static void test_malloc_basic(void) {
  /* malloc(0): a unique, freeable pointer. */
  void *a = M_malloc(0), *b = M_malloc(0);
  CHECK(a && b && a != b, "malloc(0) must return distinct non-NULL pointers (%p %p)", a, b);
  CHECK(aligned(a, 16) && aligned(b, 16), "malloc(0) alignment");
  M_free(a);
  M_free(b);
  M_free(NULL);   /* no-op */
  CHECK(M_usable(NULL) == 0, "malloc_usable_size(NULL) = %zu", M_usable(NULL));

  /* Every size up to 70 KiB, then growing steps through large and huge: alignment, usable size, writable. */
  for (size_t n = 0; n <= 70 * KiB; n += n < 1024 ? 1 : 97) {
    void *p = M_malloc(n);
    check_block(p, n, 16, "malloc");
    M_free(p);
  }
  for (size_t n = 64 * KiB; n <= 40 * MiB; n = n * 5 / 4 + 13) {
    void *p = M_malloc(n);
    check_block(p, n, 16, "malloc");
    M_free(p);
  }
  /* Many live blocks of one class are distinct and do not overlap. */
  enum { N = 4096 };
  static uint8_t *blk[N];
  for (int i = 0; i < N; i++) { blk[i] = M_malloc(40); REQUIRE(blk[i], "malloc(40)"); memset(blk[i], i & 0xFF, 40); }
  for (int i = 0; i < N; i++) {
    bool ok = true;
    for (int k = 0; k < 40; k++) ok &= blk[i][k] == (uint8_t)(i & 0xFF);
    CHECK(ok, "block %d of 40 bytes was overwritten by another", i);
    M_free(blk[i]);
  }
}

static void test_enomem(void) {
  const size_t bad[] = { SIZE_MAX, SIZE_MAX - 1, SIZE_MAX - 15, SIZE_MAX - 4096, SIZE_MAX - 4 * MiB,
                         (size_t)PTRDIFF_MAX + 1, (size_t)PTRDIFF_MAX, (size_t)1 << 62, (size_t)1 << 56 };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    size_t n = V(bad[i]);
    errno = 0;
    void *p = M_malloc(n);
    CHECK(p == NULL && errno == ENOMEM, "malloc(%zu) = %p errno %d, want NULL/ENOMEM", n, p, errno);
    errno = 0;
    p = M_calloc(1, n);
    CHECK(p == NULL && errno == ENOMEM, "calloc(1, %zu) = %p errno %d", n, p, errno);
    errno = 0;
    p = M_aligned_alloc(64, n);
    CHECK(p == NULL && errno == ENOMEM, "aligned_alloc(64, %zu) = %p errno %d", n, p, errno);
    errno = 0;
    p = M_aligned_alloc(8 * MiB, n);
    CHECK(p == NULL && errno == ENOMEM, "aligned_alloc(8M, %zu) = %p errno %d", n, p, errno);
    errno = 0;
    p = M_memalign(4096, n);
    CHECK(p == NULL && errno == ENOMEM, "memalign(4096, %zu) = %p errno %d", n, p, errno);
    errno = 0;
    p = M_valloc(n);
    CHECK(p == NULL && errno == ENOMEM, "valloc(%zu) = %p errno %d", n, p, errno);
    errno = 0;
    p = M_pvalloc(n);
    CHECK(p == NULL && errno == ENOMEM, "pvalloc(%zu) = %p errno %d", n, p, errno);
    void *out = (void *)&out;
    int r = M_posix_memalign(&out, 32, n);
    CHECK(r == ENOMEM && out == (void *)&out, "posix_memalign(32, %zu) = %d, out changed: %d", n, r, out != (void *)&out);
    /* realloc that cannot grow: NULL, ENOMEM, and the old block untouched. */
    uint8_t *q = M_malloc(100);
    REQUIRE(q, "malloc(100)");
    mt_fill(q, 100, 7);
    uint8_t *keep = mt_hide(q);
    errno = 0;
    p = M_realloc(q, n);
    CHECK(p == NULL && errno == ENOMEM, "realloc(q, %zu) = %p errno %d", n, p, errno);
    CHECK(mt_verify(keep, 100, 7) == 100, "realloc failure damaged the old block");
    M_free(keep);
  }
  /* calloc and reallocarray: multiplication overflow is a failure, not a wrap-around. */
  struct { size_t n, s; } ov[] = { { SIZE_MAX, 2 }, { 2, SIZE_MAX }, { (size_t)1 << 32, (size_t)1 << 32 },
                                  { SIZE_MAX / 16 + 1, 16 }, { (size_t)PTRDIFF_MAX, 3 }, { 65537, 281470681808897ull } };
  for (size_t i = 0; i < sizeof ov / sizeof ov[0]; i++) {
    errno = 0;
    void *p = M_calloc(V(ov[i].n), V(ov[i].s));
    CHECK(p == NULL && errno == ENOMEM, "calloc(%zu, %zu) overflow = %p errno %d", ov[i].n, ov[i].s, p, errno);
    uint8_t *q = M_malloc(64);
    REQUIRE(q, "malloc(64)");
    mt_fill(q, 64, 3);
    uint8_t *keep = mt_hide(q);
    errno = 0;
    p = M_reallocarray(q, V(ov[i].n), V(ov[i].s));
    CHECK(p == NULL && errno == ENOMEM, "reallocarray(q, %zu, %zu) overflow = %p errno %d", ov[i].n, ov[i].s, p, errno);
    CHECK(mt_verify(keep, 64, 3) == 64, "reallocarray failure damaged the block");
    errno = 0;
    p = M_reallocarray(NULL, V(ov[i].n), V(ov[i].s));
    CHECK(p == NULL && errno == ENOMEM, "reallocarray(NULL, %zu, %zu) overflow", ov[i].n, ov[i].s);
    M_free(keep);
  }
  /* A huge calloc that does not overflow but cannot be mapped. */
  errno = 0;
  void *p = M_calloc(V((size_t)1 << 31), V((size_t)1 << 30));
  CHECK(p == NULL && errno == ENOMEM, "calloc(2^31, 2^30) = %p errno %d", p, errno);
  /* reallocarray that fits behaves as realloc. */
  uint8_t *q = M_reallocarray(NULL, 10, 10);
  check_block(q, 100, 16, "reallocarray");
  mt_fill(q, 100, 9);
  q = M_reallocarray(q, 1000, 10);
  check_kept(q, 10000, 16, "reallocarray");
  CHECK(q && mt_verify(q, 100, 9) == 100, "reallocarray lost contents");
  M_free(q);
}

/* calloc hands out zeroed memory even when it reuses a block the program dirtied. */
static void test_calloc_zero(void) {
  const size_t sizes[] = { 8, 48, 100, 1000, 8000, 9000, 20000, 100000, 250000, 300 * KiB, 1 * MiB, 1900 * KiB,
                           3 * MiB, 9 * MiB };
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    size_t n = sizes[i];
    for (int round = 0; round < 6; round++) {
      uint8_t *d = M_malloc(n);
      REQUIRE(d, "malloc(%zu)", n);
      memset(d, 0xA5, M_usable(d));
      M_free(d);
      /* Same size, then the same total split as count x size: both must be zero. */
      size_t cnt = round % 2 ? 1 : (n % 8 == 0 ? 8 : 1);
      uint8_t *z = M_calloc(cnt, n / cnt);
      REQUIRE(z, "calloc(%zu, %zu)", cnt, n / cnt);
      /* Every usable byte, not just the requested ones: malloc_usable_size promises the slack to the program. */
      size_t u = M_usable(z), bad = u;
      for (size_t k = 0; k < u; k++) if (z[k]) { bad = k; break; }
      CHECK(bad == u, "calloc(%zu, %zu) round %d (reused=%d): byte %zu of %zu usable is 0x%02x", cnt, n / cnt, round,
            z == d, bad, u, bad < u ? z[bad] : 0);
      memset(z, 0xC3, n);
      M_free(z);
    }
  }
  /* A large block shrunk in place leaves a dirty tail; a later calloc that gets that span must still be zero. */
  uint8_t *a = M_malloc(1900 * KiB);
  REQUIRE(a, "malloc(1900K)");
  memset(a, 0x77, 1900 * KiB);
  uint8_t *a2 = M_realloc(a, 300 * KiB);
  REQUIRE(a2, "realloc shrink");
  uint8_t *z = M_calloc(1, 1500 * KiB);
  REQUIRE(z, "calloc(1500K)");
  size_t bad = SIZE_MAX;
  for (size_t k = 0; k < 1500 * KiB; k++) if (z[k]) { bad = k; break; }
  CHECK(bad == SIZE_MAX, "calloc after a large shrink: byte %zu not zero", bad);
  M_free(z);
  M_free(a2);
}

static void test_posix_memalign(void) {
  const size_t badal[] = { 0, 1, 2, 3, 4, 6, 12, 24, 48, 100, 4097, (size_t)1 << 63 | 8 };
  for (size_t i = 0; i < sizeof badal / sizeof badal[0]; i++) {
    void *out = (void *)&out;
    int r = M_posix_memalign(&out, V(badal[i]), 64);
    CHECK(r == EINVAL, "posix_memalign(align %zu) = %d, want EINVAL", badal[i], r);
    CHECK(out == (void *)&out, "posix_memalign(align %zu) changed *out on failure", badal[i]);
  }
  for (size_t al = sizeof(void *); al <= 64 * MiB; al *= 2) {
    const size_t sizes[] = { 0, 1, al - 1, al, al + 1, 3 * al + 5, 100 * KiB };
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
      if (sizes[k] > 80 * MiB) continue;
      void *p = NULL;
      int r = M_posix_memalign(&p, al, sizes[k]);
      CHECK(r == 0, "posix_memalign(%zu, %zu) = %d", al, sizes[k], r);
      if (r) continue;
      check_block(p, sizes[k], al, "posix_memalign");
      M_free(p);
    }
  }
}

static void test_aligned(void) {
  /* aligned_alloc: every power of two from 1 to 64 MiB, with awkward sizes; several live at once. */
  for (size_t al = 1; al <= 64 * MiB; al *= 2) {
    const size_t sizes[] = { 1, 16, al, al + 16, 2 * al, 5000, 70 * KiB, 600 * KiB, 3 * MiB };
    void *live[sizeof sizes / sizeof sizes[0]];
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
      live[k] = M_aligned_alloc(al, sizes[k]);
      check_block(live[k], sizes[k], al, "aligned_alloc");
    }
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) M_free(live[k]);
  }
  errno = 0;
  void *p = M_aligned_alloc(V(24), 64);
  CHECK(p == NULL && errno == EINVAL, "aligned_alloc(24, 64) = %p errno %d, want NULL/EINVAL", p, errno);
  errno = 0;
  p = M_aligned_alloc(V(0), 64);
  CHECK(p == NULL && errno == EINVAL, "aligned_alloc(0, 64) = %p errno %d, want NULL/EINVAL", p, errno);

  /* memalign: powers of two, and glibc's rounding of other alignments up to the next power of two. */
  for (size_t al = 1; al <= 16 * MiB; al *= 4) {
    p = M_memalign(al, 3 * al + 1);
    check_block(p, 3 * al + 1, al, "memalign");
    M_free(p);
  }
  p = M_memalign(V(24), 100);
  check_block(p, 100, 32, "memalign(24)");
  M_free(p);
  p = M_memalign(V(3000), 10);
  check_block(p, 10, 4096, "memalign(3000)");
  M_free(p);

  /* valloc: page aligned; pvalloc: page aligned and rounded up to whole pages (the page in force: mt_page). */
  const size_t pg = mt_page();
  const size_t vs[] = { 0, 1, 4095, 4096, 4097, 16385, 65537, 100000, 3 * MiB };
  for (size_t k = 0; k < sizeof vs / sizeof vs[0]; k++) {
    p = M_valloc(vs[k]);
    check_block(p, vs[k], pg, "valloc");
    M_free(p);
    p = M_pvalloc(vs[k]);
    size_t want = vs[k] ? (vs[k] + pg - 1) & ~(pg - 1) : pg;
    check_block(p, want, pg, "pvalloc");
    M_free(p);
  }
}

static void test_realloc(void) {
  /* realloc(NULL, n) is malloc(n): it hands out the block just freed (LIFO reuse of the class). */
  void *a = M_malloc(72);
  REQUIRE(a, "malloc");
  uintptr_t aa = (uintptr_t)a;
  M_free(a);
  void *b = M_realloc(NULL, 72);
  check_block(b, 72, 16, "realloc(NULL)");
  CHECK((uintptr_t)b == aa, "realloc(NULL, 72) did not behave as malloc (got %p, malloc's free block %#lx)", b,
        (unsigned long)aa);

  /* realloc(p, 0) frees p and returns NULL, as glibc does; the block is reused by the next malloc. */
  uintptr_t bb = (uintptr_t)b;
  void *r = M_realloc(b, 0);
  CHECK(r == NULL, "realloc(p, 0) = %p, want NULL (glibc behaviour)", r);
  void *c = M_malloc(72);
  CHECK((uintptr_t)c == bb, "realloc(p, 0) did not free p (next malloc %p, p %#lx)", c, (unsigned long)bb);
  M_free(c);

  /* Shrinks and same-size requests within a size class keep the pointer. */
  const size_t pairs[][2] = { { 100, 90 }, { 100, 100 }, { 100, 97 }, { 48, 33 }, { 1000, 900 }, { 5000, 4500 },
                              { 20000, 17000 }, { 200000, 190000 } };
  for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
    uint8_t *p = M_malloc(pairs[i][0]);
    REQUIRE(p, "malloc");
    mt_fill(p, pairs[i][1], i);
    uintptr_t pp = (uintptr_t)p;
    uint8_t *q = M_realloc(p, pairs[i][1]);
    CHECK((uintptr_t)q == pp, "realloc(%zu -> %zu) moved within its class", pairs[i][0], pairs[i][1]);
    CHECK(q && mt_verify(q, pairs[i][1], i) == pairs[i][1], "realloc shrink lost contents");
    M_free(q);
  }

  /* Large blocks: a shrink keeps the pointer; growing back into the freed tail (the following span) too. */
  uint8_t *p = M_malloc(1536 * KiB);
  REQUIRE(p, "malloc(1.5M)");
  mt_fill(p, 1536 * KiB, 11);
  uintptr_t pp = (uintptr_t)p;
  uint8_t *q = M_realloc(p, 700 * KiB);
  CHECK((uintptr_t)q == pp, "large shrink 1.5M -> 700K moved the block");
  REQUIRE(q, "realloc");
  CHECK(mt_verify(q, 700 * KiB, 11) == 700 * KiB, "large shrink lost contents");
  CHECK(M_usable(q) >= 700 * KiB && M_usable(q) < 1536 * KiB, "usable size after shrink: %zu", M_usable(q));
  uintptr_t qq = (uintptr_t)q;
  uint8_t *g = M_realloc(q, 1536 * KiB);
  CHECK((uintptr_t)g == qq, "large growth into the free following span moved the block (%p -> %p)", (void *)qq, g);
  REQUIRE(g, "realloc grow");
  CHECK(mt_verify(g, 700 * KiB, 11) == 700 * KiB, "large in-place growth lost contents");
  check_block(g, 1536 * KiB, 16, "realloc grow");
  M_free(g);

  /* Contents survive growth small -> medium -> large -> huge and the way back. */
  const size_t steps[] = { 1, 24, 200, 4000, 9000, 100000, 262144, 300000, 1 * MiB, 2 * MiB, 2 * MiB + 1,
                           5 * MiB, 33 * MiB, 64 * MiB, 7 * MiB, 1 * MiB, 70000, 3000, 17, 1 };
  size_t prev = 0;
  uint8_t *x = NULL;
  for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
    size_t n = steps[i];
    uint8_t *y = M_realloc(x, n);
    check_kept(y, n, 16, "realloc chain");
    REQUIRE(y, "realloc chain to %zu", n);
    size_t keep = prev < n ? prev : n;
    CHECK(mt_verify(y, keep, 99) == keep, "realloc %zu -> %zu lost contents at byte %zu", prev, n, mt_verify(y, keep, 99));
    CHECK(M_usable(y) >= n, "usable %zu < %zu", M_usable(y), n);
    mt_fill(y, n, 99);
    x = y;
    prev = n;
  }
  M_free(x);

  /* Huge blocks grow and shrink (mremap) keeping contents; big-aligned blocks can be reallocated. */
  uint8_t *h = M_malloc(6 * MiB);
  REQUIRE(h, "malloc(6M)");
  mt_fill(h, 6 * MiB, 5);
  h = M_realloc(h, 20 * MiB);
  REQUIRE(h, "realloc 20M");
  CHECK(mt_verify(h, 6 * MiB, 5) == 6 * MiB, "huge growth lost contents");
  h = M_realloc(h, 4 * MiB);
  REQUIRE(h, "realloc 4M");
  CHECK(mt_verify(h, 4 * MiB, 5) == 4 * MiB, "huge shrink lost contents");
  M_free(h);
  uint8_t *ba = M_aligned_alloc(8 * MiB, 5 * MiB);
  check_block(ba, 5 * MiB, 8 * MiB, "aligned_alloc(8M)");
  REQUIRE(ba, "aligned_alloc(8M)");
  mt_fill(ba, 5 * MiB, 6);
  uint8_t *bb2 = M_realloc(ba, 9 * MiB);
  REQUIRE(bb2, "realloc of an 8M-aligned block");
  CHECK(mt_verify(bb2, 5 * MiB, 6) == 5 * MiB, "realloc of an 8M-aligned block lost contents");
  M_free(bb2);
}

static void test_sized_free(void) {
  const size_t sizes[] = { 1, 40, 5000, 70000, 500 * KiB, 5 * MiB };
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    void *p = M_malloc(sizes[i]);
    check_block(p, sizes[i], 16, "malloc");
    uintptr_t pp = (uintptr_t)p;
    FREE_SIZED(p, sizes[i]);
    if (sizes[i] <= 5000) {   /* small classes: LIFO reuse proves the block really went back */
      void *q = M_malloc(sizes[i]);
      CHECK((uintptr_t)q == pp, "free_sized(%zu) did not free the block", sizes[i]);
      M_free(q);
    }
    p = M_aligned_alloc(256, sizes[i]);
    check_block(p, sizes[i], 256, "aligned_alloc(256)");
    FREE_ALIGNED_SIZED(p, 256, sizes[i]);
  }
  FREE_SIZED(NULL, 0);
  FREE_ALIGNED_SIZED(NULL, 64, 0);
}

/* jemalloc's non-standard API (and mallard_good_size / mallard_collect) under the three link modes. */
#define X_LG_ALIGN(la) ((int)(la))
#define X_ZERO 0x40
#if defined(MT_PREFIX)
#define X_MALLOCX mallard_mallocx
#define X_RALLOCX mallard_rallocx
#define X_XALLOCX mallard_xallocx
#define X_SALLOCX mallard_sallocx
#define X_DALLOCX mallard_dallocx
#define X_SDALLOCX mallard_sdallocx
#define X_NALLOCX mallard_nallocx
#define X_GOOD_SIZE mallard_good_size
#elif defined(MT_PRELOAD)
#define X_MALLOCX ((void *(*)(size_t, int))mt_sym("mallocx"))
#define X_RALLOCX ((void *(*)(void *, size_t, int))mt_sym("rallocx"))
#define X_XALLOCX ((size_t (*)(void *, size_t, size_t, int))mt_sym("xallocx"))
#define X_SALLOCX ((size_t (*)(const void *, int))mt_sym("sallocx"))
#define X_DALLOCX ((void (*)(void *, int))mt_sym("dallocx"))
#define X_SDALLOCX ((void (*)(void *, size_t, int))mt_sym("sdallocx"))
#define X_NALLOCX ((size_t (*)(size_t, int))mt_sym("nallocx"))
#define X_GOOD_SIZE ((size_t (*)(size_t))mt_sym("mallard_good_size"))
#else
void *mallocx(size_t size, int flags);
void *rallocx(void *p, size_t size, int flags);
size_t xallocx(void *p, size_t size, size_t extra, int flags);
size_t sallocx(const void *p, int flags);
void dallocx(void *p, int flags);
void sdallocx(void *p, size_t size, int flags);
size_t nallocx(size_t size, int flags);
#define X_MALLOCX mallocx
#define X_RALLOCX rallocx
#define X_XALLOCX xallocx
#define X_SALLOCX sallocx
#define X_DALLOCX dallocx
#define X_SDALLOCX sdallocx
#define X_NALLOCX nallocx
#define X_GOOD_SIZE mallard_good_size
#endif

/* Is every byte of p[0..n) zero? Returns the first non-zero index, or n. */
static size_t first_nonzero(const uint8_t *p, size_t n) {
  for (size_t k = 0; k < n; k++) if (p[k]) return k;
  return n;
}

/* Redis sizes its buffers with nallocx and writes up to what it returns: nallocx(n, f) must be exactly
 * sallocx(mallocx(n, f)), for every size range and alignment; MALLOCX_ZERO zeroes all of it. */
static void test_nallocx_mallocx(void) {
  const size_t sizes[] = { 0, 1, 15, 16, 17, 100, 1000, 4095, 4096, 4097, 9000, 65536, 100000, 262144, 300 * KiB,
                           1 * MiB, 1900 * KiB, 2 * MiB + 1, 4 * MiB - 1, 4 * MiB, 5 * MiB + 3, 9 * MiB };
  const int lgs[] = { 0, 3, 4, 5, 6, 8, 10, 12, 13, 16, 20, 22, 23 };
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    for (size_t j = 0; j < sizeof lgs / sizeof lgs[0]; j++) {
      size_t n = V(sizes[i]);
      int flags = X_LG_ALIGN(lgs[j]);
      size_t al = (size_t)1 << lgs[j];
      size_t want = X_NALLOCX(n, flags);
      uint8_t *p = X_MALLOCX(n, flags);
      CHECK(p != NULL, "mallocx(%zu, lg %d) = NULL", n, lgs[j]);
      if (!p) continue;
      size_t got = X_SALLOCX(p, 0);
      CHECK(want == got, "nallocx(%zu, lg %d) = %zu but sallocx(mallocx()) = %zu", n, lgs[j], want, got);
      CHECK(got >= n && got == M_usable(p), "mallocx(%zu, lg %d): sallocx %zu, usable %zu", n, lgs[j], got,
            M_usable(p));
      CHECK(aligned(p, al < 16 ? 16 : al), "mallocx(%zu, lg %d) = %p misaligned", n, lgs[j], (void *)p);
      memset(p, 0xE7, want < got ? want : got);   /* writing up to nallocx bytes is safe */
      X_DALLOCX(p, flags);
      /* The same request zeroed, likely reusing the block just dirtied: every usable byte is zero. */
      p = X_MALLOCX(n, flags | X_ZERO);
      CHECK(p != NULL, "mallocx(%zu, lg %d | ZERO) = NULL", n, lgs[j]);
      if (!p) continue;
      got = X_SALLOCX(p, 0);
      size_t bad = first_nonzero(p, got);
      CHECK(bad == got, "mallocx(%zu, lg %d | ZERO): byte %zu of %zu usable is 0x%02x", n, lgs[j], bad, got,
            bad < got ? p[bad] : 0);
      memset(p, 0x11, got);
      X_SDALLOCX(p, n, flags);
    }
  }
  /* Impossible requests: mallocx fails, and nallocx says so with 0 (Redis would otherwise write past a block). */
  const int bad_lg[] = { 63, 62, 56, 48 };
  for (size_t j = 0; j < sizeof bad_lg / sizeof bad_lg[0]; j++) {
    errno = 0;
    void *p = X_MALLOCX(V(1), X_LG_ALIGN(bad_lg[j]));
    size_t want = X_NALLOCX(V(1), X_LG_ALIGN(bad_lg[j]));
    CHECK(p == NULL, "mallocx(1, MALLOCX_LG_ALIGN(%d)) = %p", bad_lg[j], p);
    CHECK(want == 0, "nallocx(1, MALLOCX_LG_ALIGN(%d)) = %zu while mallocx fails", bad_lg[j], want);
    if (p) X_DALLOCX(p, 0);
  }
  /* Beyond PTRDIFF_MAX no object can exist: both fail (a merely unmappable size may still get a non-zero nallocx). */
  const size_t huge_bad[] = { SIZE_MAX, SIZE_MAX - 4096, SIZE_MAX - 4 * MiB, (size_t)PTRDIFF_MAX + 1 };
  for (size_t i = 0; i < sizeof huge_bad / sizeof huge_bad[0]; i++) {
    errno = 0;
    void *p = X_MALLOCX(V(huge_bad[i]), 0);
    CHECK(p == NULL && errno == ENOMEM, "mallocx(%zu) = %p errno %d", huge_bad[i], p, errno);
    CHECK(X_NALLOCX(V(huge_bad[i]), 0) == 0, "nallocx(%zu) = %zu", huge_bad[i], X_NALLOCX(V(huge_bad[i]), 0));
  }
  /* mallard_good_size(n) is what malloc(n) really gives. */
  for (size_t n = 1; n < 6 * MiB; n = n * 3 / 2 + 7) {
    void *p = M_malloc(n);
    REQUIRE(p, "malloc(%zu)", n);
    CHECK(X_GOOD_SIZE(n) == M_usable(p) && X_GOOD_SIZE(n) >= n, "mallard_good_size(%zu) = %zu, malloc's usable %zu",
          n, X_GOOD_SIZE(n), M_usable(p));
    M_free(p);
  }
}

/* A zeroed 256 MiB block comes from fresh (already zero) pages: it must not be memset into residence. */
static void test_mallocx_zero_huge_rss(void) {
  long before = mt_status_kb("VmRSS:");
  uint8_t *p = X_MALLOCX(V(256 * MiB), X_ZERO);
  long after = mt_status_kb("VmRSS:");
  CHECK(p != NULL, "mallocx(256M, ZERO) = NULL");
  if (!p) return;
  CHECK(after - before < 32 * 1024, "mallocx(256M, ZERO) made %ld KiB resident (fresh pages need no memset)",
        after - before);
  CHECK(p[0] == 0 && p[128 * MiB] == 0 && p[256 * MiB - 1] == 0, "mallocx(256M, ZERO) not zero");
  X_DALLOCX(p, 0);
}

static void test_rallocx_xallocx(void) {
  /* rallocx keeps contents and honours the alignment it is given, growing and shrinking across size ranges. */
  const size_t steps[] = { 100, 5000, 70000, 600 * KiB, 6 * MiB, 3000, 40 };
  const int lgs[] = { 0, 6, 12, 16, 21 };
  for (size_t j = 0; j < sizeof lgs / sizeof lgs[0]; j++) {
    size_t al = (size_t)1 << lgs[j];
    uint8_t *p = X_MALLOCX(steps[0], X_LG_ALIGN(lgs[j]));
    REQUIRE(p, "mallocx(%zu, lg %d)", steps[0], lgs[j]);
    mt_fill(p, steps[0], 21);
    size_t kept = steps[0];
    for (size_t i = 1; i < sizeof steps / sizeof steps[0]; i++) {
      size_t n = steps[i];
      uint8_t *q = X_RALLOCX(p, n, X_LG_ALIGN(lgs[j]));
      CHECK(q != NULL, "rallocx(%zu -> %zu, lg %d) = NULL", kept, n, lgs[j]);
      if (!q) break;
      size_t common = kept < n ? kept : n;
      CHECK(aligned(q, al < 16 ? 16 : al), "rallocx(%zu, lg %d) = %p misaligned", n, lgs[j], (void *)q);
      CHECK(mt_verify(q, common, 21) == common, "rallocx(%zu -> %zu, lg %d) lost contents at %zu", kept, n, lgs[j],
            mt_verify(q, common, 21));
      CHECK(X_SALLOCX(q, 0) >= n, "rallocx(%zu): sallocx %zu", n, X_SALLOCX(q, 0));
      mt_fill(q, n, 21);
      kept = n;
      p = q;
    }
    X_DALLOCX(p, 0);
  }
  /* rallocx with MALLOCX_ZERO: the bytes past the old usable size are zero. */
  uint8_t *p = X_MALLOCX(1000, 0);
  REQUIRE(p, "mallocx(1000)");
  size_t old = X_SALLOCX(p, 0);
  memset(p, 0x99, old);
  uint8_t *q = X_RALLOCX(p, 300 * KiB, X_ZERO);
  REQUIRE(q, "rallocx(300K, ZERO)");
  size_t nu = X_SALLOCX(q, 0);
  CHECK(first_nonzero(q + old, nu - old) == nu - old, "rallocx(ZERO): grown bytes not zero");
  CHECK(q[0] == 0x99 && q[old - 1] == 0x99, "rallocx(ZERO) lost the old contents");
  X_DALLOCX(q, 0);
  /* rallocx that cannot be served: NULL, old block intact. */
  p = X_MALLOCX(200, 0);
  REQUIRE(p, "mallocx(200)");
  mt_fill(p, 200, 5);
  uint8_t *keep = mt_hide(p);
  q = X_RALLOCX(p, V(SIZE_MAX - 4096), 0);
  CHECK(q == NULL, "rallocx(SIZE_MAX - 4096) = %p", (void *)q);
  CHECK(mt_verify(keep, 200, 5) == 200, "failed rallocx damaged the block");
  q = X_RALLOCX(keep, 100, X_LG_ALIGN(63));
  CHECK(q == NULL, "rallocx(lg 63) = %p", (void *)q);
  CHECK(mt_verify(keep, 100, 5) == 100, "failed rallocx(lg 63) damaged the block");
  X_DALLOCX(keep, 0);

  /* xallocx resizes in place or not at all: it returns the usable size afterwards (>= the old one when asked to
   * grow), equal to sallocx, and the block and its contents stay where they are. */
  const size_t xs[] = { 48, 3000, 100000, 1 * MiB, 8 * MiB };
  for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++) {
    uint8_t *b = X_MALLOCX(xs[i], 0);
    REQUIRE(b, "mallocx(%zu)", xs[i]);
    size_t u0 = X_SALLOCX(b, 0);
    mt_fill(b, u0, 8);
    size_t u1 = X_XALLOCX(b, xs[i] * 2, 0, 0);
    CHECK(u1 >= u0 && u1 == X_SALLOCX(b, 0), "xallocx(%zu -> %zu) = %zu, old usable %zu, sallocx %zu", xs[i],
          xs[i] * 2, u1, u0, X_SALLOCX(b, 0));
    CHECK(mt_verify(b, u0, 8) == u0, "xallocx grow damaged the contents");
    size_t u2 = X_XALLOCX(b, xs[i], xs[i], 0);
    CHECK(u2 >= xs[i] && u2 == X_SALLOCX(b, 0), "xallocx(%zu, extra %zu) = %zu, sallocx %zu", xs[i], xs[i], u2,
          X_SALLOCX(b, 0));
    size_t u3 = X_XALLOCX(b, 1, 0, 0);
    CHECK(u3 >= 1 && u3 == X_SALLOCX(b, 0) && u3 <= u2, "xallocx shrink = %zu (sallocx %zu, was %zu)", u3,
          X_SALLOCX(b, 0), u2);
    size_t keepn = u3 < u0 ? u3 : u0;
    CHECK(mt_verify(b, keepn, 8) == keepn, "xallocx shrink damaged the contents");
    memset(b, 0, u3);   /* the usable size it returned is writable */
    X_SDALLOCX(b, xs[i], 0);
  }
}

/* mallard_collect gives cached memory back and leaves every live block as it was. */
static void test_collect(void) {
  enum { N = 300 };
  static uint8_t *live[N];
  for (int i = 0; i < N; i++) {
    size_t sz = 16 + (size_t)i * 997;
    live[i] = M_malloc(sz);
    REQUIRE(live[i], "malloc(%zu)", sz);
    mt_fill(live[i], sz, (uint64_t)i);
  }
  for (int i = 0; i < N; i += 2) { M_free(live[i]); live[i] = NULL; }
  MT_COLLECT(false);
  MT_COLLECT(true);
  for (int i = 1; i < N; i += 2) {
    size_t sz = 16 + (size_t)i * 997;
    CHECK(mt_verify(live[i], sz, (uint64_t)i) == sz, "mallard_collect damaged live block %d", i);
    M_free(live[i]);
  }
  void *p = M_malloc(50000);
  check_block(p, 50000, 16, "malloc after mallard_collect");
  M_free(p);
}

#ifndef MT_PREFIX
/* glibc's internal names (__libc_malloc & co.) must reach Mallard too: some programs and libraries call them. */
static void test_libc_names(void) {
#ifdef MT_PRELOAD
#define LIBC(name, type) ((type)mt_sym(#name))
#else
#define LIBC(name, type) (name)
#endif
  void *p = LIBC(__libc_malloc, void *(*)(size_t))(100);
  check_block(p, 100, 16, "__libc_malloc");
  mt_fill(p, 100, 1);
  p = LIBC(__libc_realloc, void *(*)(void *, size_t))(p, 300000);
  check_kept(p, 300000, 16, "__libc_realloc");
  CHECK(p && mt_verify(p, 100, 1) == 100, "__libc_realloc lost contents");
  LIBC(__libc_free, void (*)(void *))(p);
  uint8_t *z = LIBC(__libc_calloc, void *(*)(size_t, size_t))(10, 10);
  check_block(z, 100, 16, "__libc_calloc");
  LIBC(__libc_free, void (*)(void *))(z);
  p = LIBC(__libc_memalign, void *(*)(size_t, size_t))(1024, 10);
  check_block(p, 10, 1024, "__libc_memalign");
  free(p);
  p = LIBC(__libc_valloc, void *(*)(size_t))(10);
  check_block(p, 10, 4096, "__libc_valloc");
  free(p);
  p = LIBC(__libc_pvalloc, void *(*)(size_t))(10);
  check_block(p, 4096, 4096, "__libc_pvalloc");
  free(p);
  p = NULL;
  CHECK(LIBC(__posix_memalign, int (*)(void **, size_t, size_t))(&p, 64, 10) == 0, "__posix_memalign");
  check_block(p, 10, 64, "__posix_memalign");
  free(p);
  errno = 0;
  p = LIBC(__libc_malloc, void *(*)(size_t))(V(SIZE_MAX));
  CHECK(p == NULL && errno == ENOMEM, "__libc_malloc(SIZE_MAX)");
  /* glibc extensions answered by Mallard. */
}

/* malloc_trim(0): 1 when it gave memory back to the system, 0 otherwise (glibc's contract); RSS really drops. */
static void test_malloc_trim(void) {
  enum { NB = 2048 };
  static void *blk[NB];
  mt_rng_t r;
  mt_rng_seed(&r, 77);
  size_t total = 0;
  int n = 0;
  /* A 64 MiB spread of sizes from small to large, every page touched. */
  while (total < 64 * MiB && n < NB) {
    size_t sz = 1000 + (size_t)mt_rng_below(&r, 120 * KiB);
    blk[n] = malloc(sz);
    REQUIRE(blk[n], "malloc(%zu)", sz);
    memset(blk[n], 0x3C, sz);
    total += sz;
    n++;
  }
  for (int i = 0; i < n; i++) free(blk[i]);
  long before = mt_status_kb("VmRSS:");
  int rc = malloc_trim(0);
  long after = mt_status_kb("VmRSS:");
  CHECK(rc == 1, "malloc_trim(0) after freeing %zu MiB returned %d, want 1 (memory released)", total / MiB, rc);
  CHECK(after < before - 32 * 1024, "malloc_trim(0): VmRSS %ld KiB -> %ld KiB, want a drop of more than 32 MiB", before,
        after);
  /* Nothing freed since: nothing to release. (The VmRSS read above opens and closes a FILE, whose page the first
   * of these two calls may still give back.) */
  malloc_trim(0);
  rc = malloc_trim(0);
  CHECK(rc == 0, "a second malloc_trim(0) with nothing freed in between returned %d, want 0", rc);
  /* The allocator works on. */
  void *p = malloc(100000);
  check_block(p, 100000, 16, "malloc after malloc_trim");
  free(p);
}

#ifndef M_TRIM_THRESHOLD   /* musl's malloc.h names none of glibc's parameters: glibc's numbers, as Mallard reads them */
enum { M_MXFAST = 1, M_TRIM_THRESHOLD = -1, M_TOP_PAD = -2, M_MMAP_THRESHOLD = -3, M_MMAP_MAX = -4,
       M_CHECK_ACTION = -5, M_PERTURB = -6, M_ARENA_TEST = -7, M_ARENA_MAX = -8 };
#endif

/* mallopt answers as glibc 2.36 does (checked against glibc itself, docs/COMPAT.md): 1 for every parameter, known
 * or not, whatever the value (M_ARENA_MAX 0, -1, 128 included), except M_MXFAST outside 0..160,
 * which is 0. */
static void test_mallopt(void) {
  const int params[] = { M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD, M_MMAP_MAX, M_CHECK_ACTION, M_PERTURB,
                         M_ARENA_TEST, M_MXFAST, 12345, -100, M_ARENA_MAX };   /* M_ARENA_MAX last: it stays set */
  const int vals[] = { -2147483647 - 1, -1, 0, 1, 64, 128, 160, 161, 4096, 32 << 20, (32 << 20) + 1, 2147483647, 8 };
  for (size_t i = 0; i < sizeof params / sizeof params[0]; i++)
    for (size_t j = 0; j < sizeof vals / sizeof vals[0]; j++) {
      int want = params[i] == M_MXFAST ? (vals[j] >= 0 && vals[j] <= 160) : 1;
      CHECK(mallopt(params[i], vals[j]) == want, "mallopt(%d, %d) != %d (glibc 2.36's answer)", params[i], vals[j],
            want);
    }
  void *p = malloc(1000);
  check_block(p, 1000, 16, "malloc after mallopt");
  free(p);
}
#endif

int main(void) {
  printf("test_api (%s build)\n", MT_MODE);
  test_identity();
  test_malloc_basic();
  test_enomem();
  test_calloc_zero();
  test_posix_memalign();
  test_aligned();
  test_realloc();
  test_sized_free();
  test_mallocx_zero_huge_rss();
  test_nallocx_mallocx();
  test_rallocx_xallocx();
  test_collect();
#ifndef MT_PREFIX
  test_libc_names();
  test_malloc_trim();
  test_mallopt();   /* last: M_ARENA_MAX may change how the allocator runs from here on */
#endif
  return mt_result("test_api");
}
