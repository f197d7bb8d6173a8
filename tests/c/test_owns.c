/* test_owns.c — mallard_owns answers for blocks whose memory changed shape (issue 14, item 5a): interior pointers of a
 * huge block served from two merged cached mappings, and slots of a free span that still carry an old span's marks. */
#include "mtest.h"

#define KiB ((size_t)1024)
#define MiB ((size_t)1024 * 1024)
#define SEG (4 * MiB)

static uint8_t *seg_start(const void *p) { return (uint8_t *)((uintptr_t)p & ~(uintptr_t)(SEG - 1)); }

/* Two 8 MiB huge mappings, side by side, freed into the huge cache: it merges them into one 16 MiB entry, which a
 * 15 MiB request then takes whole. Every byte of that block is Mallard's, 12..15 MiB in included (the walk down to
 * the block's header used to stop after the largest mapping ever made, 8 MiB: the merged one was not counted). */
static void merged_huge(void) {
  uint8_t *keep = M_malloc(3 * MiB);   /* live throughout: learns the header offset, stays out of the cache */
  REQUIRE(keep, "malloc(3 MiB)");
  size_t off = (size_t)(keep - seg_start(keep));
  uint8_t *a = M_malloc(8 * MiB - off);   /* mappings of exactly 8 MiB: the next one is mapped right below */
  uint8_t *b = M_malloc(8 * MiB - off);
  REQUIRE(a && b, "malloc(8 MiB - %zu)", off);
  REQUIRE(seg_start(b) + 8 * MiB == seg_start(a), "the two mappings are not adjacent (%p, %p)", (void *)a, (void *)b);
  M_free(a);
  M_free(b);   /* cached next to a's mapping: merged into one entry with b's header */
  size_t n = 15 * MiB;
  uint8_t *q = M_malloc(n);
  REQUIRE(q, "malloc(15 MiB)");
  CHECK(q == b, "the 15 MiB block %p is not the merged mapping (%p): set-up changed", (void *)q, (void *)b);
  for (size_t mb = 0; mb < 15; mb++)
    CHECK(MT_OWNS(q + mb * MiB + 4096), "owns(merged block + %zu MiB) false", mb);
  CHECK(MT_OWNS(q + n - 1), "owns(last byte of the merged block) false");
  CHECK(MT_OWNS(a + 4 * MiB), "owns(inside the upper, merged-away mapping) false");
  CHECK(!MT_OWNS(q + n), "owns(merged block + 15 MiB: past its usable size) true");
  CHECK(!MT_OWNS(keep + 3 * MiB + 4096), "owns(past a 3 MiB block) true");
  M_free(q);
  M_free(keep);
}

/* A free span's inner slots keep the marks of the span they belonged to: a 640 KiB block freed, then 320 KiB
 * taken from the same place. The freed slots behind the new block are nobody's. */
static void stale_span_marks(void) {
  uint8_t *x = M_malloc(640 * KiB - 64);   /* 10 slots */
  uint8_t *pin = M_malloc(640 * KiB - 64); /* keeps the arena's other free space apart from x's span */
  REQUIRE(x && pin, "malloc(640 KiB)");
  M_free(x);
  uint8_t *y = M_malloc(320 * KiB - 64);   /* 5 slots: best fit puts it where x was */
  REQUIRE(y, "malloc(320 KiB)");
  REQUIRE(y == x, "the 320 KiB block %p did not land where the 640 KiB one was (%p)", (void *)y, (void *)x);
  CHECK(MT_OWNS(y) && MT_OWNS(y + 320 * KiB - 65), "owns(the 320 KiB block) false");
  for (size_t s = 5; s < 10; s++)
    CHECK(!MT_OWNS(x + s * 64 * KiB + 100), "owns(free slot %zu of the old 640 KiB span) true", s);
  M_free(y);
  M_free(pin);
}

int main(void) {
  merged_huge();
  stale_span_marks();
  return mt_result("test_owns[" MT_MODE "]");
}
