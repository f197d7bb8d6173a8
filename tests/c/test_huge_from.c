/* test_huge_from.c — realloc(NULL, n) above MLD_HUGE_FROM (512 KiB) starts a growable buffer in a mapping of its own:
 *   untouched  dirty spans wait in the arena (8 blocks of 512 KiB written and freed); realloc(NULL, 800 KiB), of which
 *              64 KiB are written, holds about 64 KiB resident, not 800 KiB of pages earlier blocks made resident;
 *              malloc(800 KiB) is a span (on the dirty spans: a block malloc asks for is usually written whole);
 *   bounds     realloc(NULL, 512 KiB) is a span of the arena (large_active), realloc(NULL, 512 KiB + 1) is not, and
 *              stays a mapping through realloc to 1 MiB and back to 600 KiB (shrunk where it is);
 *   grown      a 400 KiB span grown by realloc to 600 KiB (in place), 1 MiB (moved: its neighbour was taken) and
 *              1.9 MiB stays a span (later growths in place, no system call), and its contents move with it. */
#include "mtest.h"

#define KiB ((size_t)1024)

static size_t large_active(void) { return mt_ctl_size("stats.arenas.0.large_active"); }

static void case_untouched(void) {
  void *b[8];
  for (int i = 0; i < 8; i++) {
    b[i] = M_malloc(512 * KiB);
    REQUIRE(b[i], "malloc(512 KiB)");
    mt_fill(b[i], 512 * KiB, (uint64_t)i);   /* resident, through an opaque fill */
  }
  for (int i = 0; i < 8; i++) M_free(b[i]);
  size_t dirty = mt_ctl_size("stats.dirty");
  REQUIRE(dirty >= 4096 * KiB, "only %zu bytes dirty after freeing 4 MiB written", dirty);
  size_t a0 = large_active();
  unsigned char *m = M_malloc(800 * KiB);
  REQUIRE(m, "malloc(800 KiB)");
  CHECK(large_active() >= a0 + 800 * KiB, "malloc(800 KiB) is not a span (large_active %zu -> %zu)", a0, large_active());
  M_free(m);
  unsigned char *p = M_realloc(NULL, 800 * KiB);
  REQUIRE(p, "realloc(NULL, 800 KiB)");
  mt_fill(p, 64 * KiB, 99);
  size_t total, res = mt_resident_pages(p, 800 * KiB, &total) * (size_t)sysconf(_SC_PAGESIZE);
  printf("untouched: %zu KiB of the 800 KiB block resident with 64 KiB written (%zu KiB dirty in the arena)\n",
         res / KiB, dirty / KiB);
  /* 64 KiB written, plus the OS page each end may share with the block's header or neighbour */
  CHECK(res <= 64 * KiB + 2 * (size_t)sysconf(_SC_PAGESIZE), "%zu KiB resident under an 800 KiB block with 64 KiB written",
        res / KiB);
  M_free(p);
}

static void case_bounds(void) {
  size_t a0 = large_active();
  void *s = M_realloc(NULL, 512 * KiB);
  REQUIRE(s, "realloc(NULL, 512 KiB)");
  size_t a1 = large_active();
  CHECK(a1 >= a0 + 512 * KiB, "realloc(NULL, 512 KiB) is not a span of arena 0 (large_active %zu -> %zu)", a0, a1);
  unsigned char *h = M_realloc(NULL, 512 * KiB + 1);
  REQUIRE(h, "realloc(NULL, 512 KiB + 1)");
  size_t a2 = large_active();
  CHECK(a2 == a1, "realloc(NULL, 512 KiB + 1) is a span (large_active %zu -> %zu)", a1, a2);
  memset(h, 0x3a, 512 * KiB + 1);
  unsigned char *h2 = M_realloc(h, 1024 * KiB);   /* a huge block stays one: resized where it is, or moved whole */
  REQUIRE(h2, "realloc(1 MiB)");
  h = h2;
  unsigned char *h3 = M_realloc(h, 600 * KiB);    /* shrunk where it is, not copied into a new block */
  REQUIRE(h3, "realloc(600 KiB)");
  CHECK(h3 == h2, "a 1 MiB huge block shrunk to 600 KiB moved (%p -> %p)", (void *)h2, (void *)h3);
  h = h3;
  size_t bad = 0;
  for (size_t i = 0; i <= 512 * KiB; i++) bad += h3[i] != 0x3a;   /* what was written */
  CHECK(bad == 0, "%zu bytes changed by the reallocs", bad);
  CHECK(large_active() == a1, "the huge block became a span (large_active %zu -> %zu)", a1, large_active());
  M_free(s);
  M_free(h);
}

static void case_grown(void) {
  size_t a0 = large_active();
  unsigned char *p = M_malloc(400 * KiB);   /* 7 slots */
  REQUIRE(p, "malloc(400 KiB)");
  memset(p, 0x5c, 400 * KiB);
  /* The first growth is in place; the span after the block is then taken, so the next one moves it. */
  const size_t steps[] = { 600 * KiB, 1024 * KiB, 1900 * KiB };
  void *pin = NULL;
  for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
    unsigned char *q = M_realloc(p, steps[i]);
    REQUIRE(q, "realloc(%zu KiB)", steps[i] / KiB);
    if (i == 1) CHECK(q != p, "the block grown to 1 MiB did not move: its neighbour was not taken");
    p = q;
    size_t a = large_active();
    CHECK(a >= a0 + steps[i], "a block grown to %zu KiB is not a span (large_active %zu -> %zu)", steps[i] / KiB, a0, a);
    if (i == 0) {
      pin = M_malloc(300 * KiB);   /* best fit: the free span right after the block */
      REQUIRE(pin, "malloc(300 KiB)");
      a0 += 320 * KiB;             /* 5 slots */
    }
  }
  size_t bad = 0;
  for (size_t i = 0; i < 400 * KiB; i++) bad += p[i] != 0x5c;
  CHECK(bad == 0, "%zu bytes changed while the block grew", bad);
  M_free(p);
  M_free(pin);
}

int main(int argc, char **argv) {
  REQUIRE(argc == 2, "usage: %s untouched|bounds|grown", argv[0]);
  if (!strcmp(argv[1], "untouched")) case_untouched();
  else if (!strcmp(argv[1], "bounds")) case_bounds();
  else if (!strcmp(argv[1], "grown")) case_grown();
  else REQUIRE(0, "unknown case %s", argv[1]);
  return mt_result("test_huge_from");
}
