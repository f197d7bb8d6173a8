/* core/size_classes.c — the size-class table: 16-byte steps to 128 B, then four classes per doubling up to 256 KiB. */
#include "core/core.h"

/* The tables are computed by the compiler: malloc may run before any initialisation code (ld.so and other
 * libraries' constructors allocate first), and the very first call must already map its size correctly. */

/* floor(log2(x)) for 128 <= x < 2^18, as a constant expression. */
#define LOG2F(x) ((x) >= 131072 ? 17 : (x) >= 65536 ? 16 : (x) >= 32768 ? 15 : (x) >= 16384 ? 14 : (x) >= 8192 ? 13 \
                  : (x) >= 4096 ? 12 : (x) >= 2048 ? 11 : (x) >= 1024 ? 10 : (x) >= 512 ? 9 : (x) >= 256 ? 8 : 7)
/* Class of a size: up to 128 in 16-byte steps; above, (2^b, 2^(b+1)] is cut in four steps of 2^(b-2). */
#define CLASS_OF(s) ((s) <= 128 ? ((s) ? ((s) + 15) / 16 - 1 : 0)                                             \
                     : 8 + (LOG2F((s) - 1) - 7) * 4 + (((s) - 1 - (1 << LOG2F((s) - 1))) >> (LOG2F((s) - 1) - 2)))
/* Size of class c. */
#define SIZE_OF(c) ((c) < 8 ? 16 * ((c) + 1) : (1 << (7 + ((c) - 8) / 4)) + (((c) - 8) % 4 + 1) * (1 << (5 + ((c) - 8) / 4)))

#define T1(i) (uint8_t)(CLASS_OF((i) * 16)),   /* clang checks both arms of the conditional: cast */
#define T4(i) T1(i) T1((i) + 1) T1((i) + 2) T1((i) + 3)
#define T16(i) T4(i) T4((i) + 4) T4((i) + 8) T4((i) + 12)
#define T64(i) T16(i) T16((i) + 16) T16((i) + 32) T16((i) + 48)
#define T256(i) T64(i) T64((i) + 64) T64((i) + 128) T64((i) + 192)
const uint8_t mld_small_class[MLD_SMALL_MAX / 16 + 1] = { T256(0) T256(256) T1(512) };

#define S1(c) SIZE_OF(c),
#define S4(c) S1(c) S1((c) + 1) S1((c) + 2) S1((c) + 3)
const uint32_t mld_class_size[MLD_NUM_CLASSES] = { S4(0) S4(4) S4(8) S4(12) S4(16) S4(20) S4(24) S4(28) S4(32)
                                                   S4(36) S4(40) S4(44) S4(48) };
_Static_assert(SIZE_OF(MLD_NUM_CLASSES - 1) == MLD_MEDIUM_MAX, "the last class is the medium limit");
_Static_assert(CLASS_OF(MLD_MEDIUM_MAX) == MLD_NUM_CLASSES - 1, "the medium limit maps to the last class");

/* Class of a size in (MLD_SMALL_MAX, MLD_MEDIUM_MAX]. */
unsigned mld_size_class_slow(size_t size) {
  unsigned b = 63u - (unsigned)__builtin_clzl(size - 1);
  return 8u + (b - 7u) * 4u + (unsigned)((size - 1 - ((size_t)1 << b)) >> (b - 2));
}
