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
      size_t bad = n;
      for (size_t k = 0; k < n; k++) if (z[k]) { bad = k; break; }
      CHECK(bad == n, "calloc(%zu, %zu) round %d (reused=%d): byte %zu is 0x%02x", cnt, n / cnt, round, z == d, bad,
            bad < n ? z[bad] : 0);
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

  /* valloc: page aligned; pvalloc: page aligned and rounded up to whole pages. */
  const size_t vs[] = { 0, 1, 4095, 4096, 4097, 100000, 3 * MiB };
  for (size_t k = 0; k < sizeof vs / sizeof vs[0]; k++) {
    p = M_valloc(vs[k]);
    check_block(p, vs[k], 4096, "valloc");
    M_free(p);
    p = M_pvalloc(vs[k]);
    size_t want = vs[k] ? (vs[k] + 4095) & ~(size_t)4095 : 4096;
    check_block(p, want, 4096, "pvalloc");
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
  CHECK(malloc_trim(0) == 1, "malloc_trim");
  CHECK(mallopt(M_ARENA_MAX, 1) == 1, "mallopt");
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
#ifndef MT_PREFIX
  test_libc_names();
#endif
  return mt_result("test_api");
}
