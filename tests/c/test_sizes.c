/* test_sizes.c — hostile sizes and zeroing promises: huge realloc near SIZE_MAX, calloc/mallocx zero the usable
 * size, nallocx agrees with mallocx, mallard_owns sees every byte of a huge block (issue 8, items 1 and 12). */
#include "mtest.h"
#include <sys/mman.h>

#ifdef MT_PREFIX
#define X_nallocx mallard_nallocx
#define X_mallocx mallard_mallocx
#define X_sallocx mallard_sallocx
#elif defined(MT_PRELOAD)   /* linked against nothing of Mallard's: found in the process */
#define X_nallocx(n, f) (((size_t (*)(size_t, int))mt_sym("nallocx"))(n, f))
#define X_mallocx(n, f) (((void *(*)(size_t, int))mt_sym("mallocx"))(n, f))
#define X_sallocx(p, f) (((size_t (*)(const void *, int))mt_sym("sallocx"))(p, f))
#else
size_t nallocx(size_t size, int flags);
void *mallocx(size_t size, int flags);
size_t sallocx(const void *p, int flags);
#define X_nallocx nallocx
#define X_mallocx mallocx
#define X_sallocx sallocx
#endif
#define LG_ALIGN(la) ((int)(la))
#define X_ZERO 0x40

/* A size the compiler cannot see (it would refuse to compile calls with sizes above PTRDIFF_MAX). */
static size_t opaque(size_t x) {
  __asm__ volatile("" : "+r"(x));
  return x;
}

/* Filled through an opaque pointer so that no compiler can drop the writes before the free. */
static void *(*volatile opaque_memset)(void *, int, size_t) = memset;

static void huge_realloc_overflow(void) {
  const size_t n = 8u << 20;   /* a huge block: its own mapping, resized with mremap */
  size_t bad[] = { SIZE_MAX, SIZE_MAX - 4095, (size_t)-4096, SIZE_MAX - (16u << 10), (size_t)PTRDIFF_MAX + 1,
                   0xAAAAAAAAAAAAAAABull /* + half of itself wraps to 0 */ };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    uint8_t *p = M_malloc(n);
    REQUIRE(p, "malloc(8 MiB)");
    mt_fill(p, n, i + 1);
    size_t before = M_usable(p);
    errno = 0;
    void *q = M_realloc(p, opaque(bad[i]));
    CHECK(q == NULL, "realloc(p, %#zx) returned %p (p=%p)", bad[i], q, (void *)p);
    CHECK(errno == ENOMEM, "realloc(p, %#zx): errno %d, want ENOMEM", bad[i], errno);
    p = mt_hide(p);
    CHECK(M_usable(p) == before, "realloc(p, %#zx) changed the usable size %zu -> %zu", bad[i], before, M_usable(p));
    CHECK(mt_verify(p, n, i + 1) == n, "realloc(p, %#zx) damaged the block", bad[i]);
    M_free(p);
  }
  /* The same near SIZE_MAX for small and large blocks, and malloc/calloc/aligned of such sizes. */
  size_t sizes[] = { 100, 100000 };
  for (size_t i = 0; i < 2; i++) {
    uint8_t *p = M_malloc(sizes[i]);
    REQUIRE(p, "malloc");
    mt_fill(p, sizes[i], 7);
    errno = 0;
    CHECK(M_realloc(p, opaque(SIZE_MAX)) == NULL && errno == ENOMEM, "realloc(%zu-byte block, SIZE_MAX)", sizes[i]);
    p = mt_hide(p);
    CHECK(mt_verify(p, sizes[i], 7) == sizes[i], "block damaged");
    M_free(p);
  }
  size_t huge[] = { SIZE_MAX, SIZE_MAX - 16384, SIZE_MAX - (4u << 20), (size_t)PTRDIFF_MAX + 1 };
  for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
    errno = 0;
    CHECK(M_malloc(opaque(huge[i])) == NULL && errno == ENOMEM, "malloc(%#zx)", huge[i]);
    errno = 0;
    CHECK(M_aligned_alloc(1u << 22, opaque(huge[i] & ~(size_t)((1u << 22) - 1))) == NULL && errno == ENOMEM,
          "aligned_alloc(4 MiB, %#zx)", huge[i]);
    errno = 0;
    CHECK(M_calloc(1, opaque(huge[i])) == NULL && errno == ENOMEM, "calloc(1, %#zx)", huge[i]);
    CHECK(X_nallocx(huge[i], 0) == 0, "nallocx(%#zx) = %zu, want 0", huge[i], X_nallocx(huge[i], 0));
  }
}

/* calloc and MALLOCX_ZERO: every byte malloc_usable_size reports is zero, also in a reused dirty block. */
static void zeroing(void) {
  size_t sizes[] = { 1, 100, 1000, 5000, 100000, 3u << 20 };
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    for (int round = 0; round < 3; round++) {
      uint8_t *d = M_malloc(sizes[i]);
      REQUIRE(d, "malloc");
      opaque_memset(d, 0xA5, M_usable(d));
      M_free(d);   /* the next block of this size is likely this one: dirty */
      uint8_t *p = M_calloc(1, sizes[i]);
      REQUIRE(p, "calloc");
      size_t u = M_usable(p), bad = u;
      for (size_t k = 0; k < u; k++) if (p[k]) { bad = k; break; }
      CHECK(bad == u, "calloc(1, %zu): byte %zu of %zu usable is %#x", sizes[i], bad, u, bad < u ? p[bad] : 0);
      opaque_memset(p, 0x5A, u);
      M_free(p);
      uint8_t *x = X_mallocx(sizes[i], X_ZERO | (round ? LG_ALIGN(4 + round * 4) : 0));
      REQUIRE(x, "mallocx");
      u = X_sallocx(x, 0);
      bad = u;
      for (size_t k = 0; k < u; k++) if (x[k]) { bad = k; break; }
      CHECK(bad == u, "mallocx(%zu, ZERO): byte %zu of %zu usable is non-zero", sizes[i], bad, u);
      M_free(x);
    }
  }
  /* A zeroed fresh mapping is not written: 256 MiB zeroed costs next to no resident memory. */
  long rss0 = mt_status_kb("VmRSS:");
  void *big = X_mallocx(256u << 20, X_ZERO);
  REQUIRE(big, "mallocx(256 MiB, ZERO)");
  long grew = mt_status_kb("VmRSS:") - rss0;
  CHECK(grew < 16 * 1024, "mallocx(256 MiB, MALLOCX_ZERO) made %ld KiB resident", grew);
  M_free(big);
  big = M_calloc(1, 256u << 20);
  REQUIRE(big, "calloc(256 MiB)");
  M_free(big);
}

/* nallocx answers exactly what mallocx gives, and 0 when mallocx fails. A sampled guarded block (guard_sample: on by
 * default in the secure variant; with 64 KiB pages a 9000-byte request can be one) is the documented exception: its
 * usable size is exactly the request (docs/SECURITY.md), so only that is checked and written for it. */
static void nallocx_agrees(void) {
  size_t sizes[] = { 1, 16, 17, 1000, 8192, 9000, 300000, 2u << 20, (2u << 20) + 1, 9u << 20 };
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    for (int la = 0; la <= 23; la += 1) {
      size_t n = X_nallocx(sizes[i], LG_ALIGN(la));
      uint64_t samples = mt_ctl_u64("stats.guard.samples");
      void *p = X_mallocx(sizes[i], LG_ALIGN(la));
      REQUIRE(p, "mallocx(%zu, lg_align %d)", sizes[i], la);
      size_t got = X_sallocx(p, 0);
      if (mt_ctl_u64("stats.guard.samples") != samples) {
        CHECK(got == sizes[i] && n >= got, "sampled mallocx(%zu, lg %d): sallocx %zu, nallocx %zu", sizes[i], la, got, n);
        n = got;
      } else {
        CHECK(n == got, "nallocx(%zu, lg %d) = %zu, sallocx = %zu", sizes[i], la, n, got);
      }
      CHECK(((uintptr_t)p & (((uintptr_t)1 << la) - 1)) == 0, "mallocx(%zu, lg %d) = %p misaligned", sizes[i], la, p);
      opaque_memset(p, 1, n);   /* the whole answer of nallocx is writable (redis relies on it) */
      M_free(p);
    }
  }
  for (int la = 47; la <= 63; la++) {
    errno = 0;
    void *p = X_mallocx(1, LG_ALIGN(la));
    size_t n = X_nallocx(1, LG_ALIGN(la));
    CHECK((p == NULL) == (n == 0), "lg_align %d: mallocx %p but nallocx %zu", la, p, n);
    if (p) M_free(p);
  }
}

/* mallard_owns: every byte of a huge block, nothing outside it. */
static void owns_huge(void) {
  size_t n = 20u << 20;
  uint8_t *p = M_malloc(n);
  REQUIRE(p, "malloc(20 MiB)");
  for (size_t off = 0; off < n; off += 1u << 20) CHECK(MT_OWNS(p + off), "owns(p + %zu MiB) false", off >> 20);
  CHECK(MT_OWNS(p + n - 1), "owns(last byte) false");
  CHECK(!MT_OWNS(p + n + (8u << 20)), "owns(8 MiB past the end) true");
  void *q = M_aligned_alloc(8u << 20, 12u << 20);   /* aligned beyond a segment: looked up apart */
  REQUIRE(q, "aligned_alloc(8 MiB, 12 MiB)");
  CHECK(MT_OWNS((uint8_t *)q + (9u << 20)), "owns(interior of an 8 MiB-aligned block) false");
  M_free(q);
  M_free(p);
  uint8_t stack[16];
  CHECK(!MT_OWNS(stack), "owns(stack) true");
  void *m = mmap(NULL, 1u << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(!MT_OWNS(m), "owns(a mapping of the program) true");
  munmap(m, 1u << 20);
}

int main(void) {
  huge_realloc_overflow();
  zeroing();
  nallocx_agrees();
  owns_huge();
  return mt_result("test_sizes[" MT_MODE "]");
}
