/* size_classes.c — the size-class table: 16-byte steps to 128 B, then four classes per doubling up to 256 KiB. */
#include "internal.h"

uint32_t mld_class_size[MLD_NUM_CLASSES];
uint8_t mld_small_class[MLD_SMALL_MAX / 16 + 1];

/* Class of a size in (128, MEDIUM_MAX]: size lies in (2^b, 2^(b+1)], which is cut in four steps of 2^(b-2). */
static unsigned class_above_128(size_t size) {
  unsigned b = 63u - (unsigned)__builtin_clzl(size - 1);
  return 8u + (b - 7u) * 4u + (unsigned)((size - 1 - ((size_t)1 << b)) >> (b - 2));
}

unsigned mld_size_class_slow(size_t size) {
  return class_above_128(size);
}

static uint32_t class_size_of(unsigned c) {
  if (c < 8) return 16u * (c + 1);
  unsigned k = c - 8, b = 7 + k / 4;
  return (1u << b) + (k % 4 + 1) * (1u << (b - 2));
}

void mld_size_classes_init(void) {
  for (unsigned c = 0; c < MLD_NUM_CLASSES; c++) mld_class_size[c] = class_size_of(c);
  for (size_t i = 0; i <= MLD_SMALL_MAX / 16; i++) {
    size_t size = i * 16;
    mld_small_class[i] = (uint8_t)(size <= 128 ? (size == 0 ? 0 : i - 1) : class_above_128(size));
  }
}
