/* tests/pagesize/addr_bits.c — the ownership map covers the whole user address space of the architecture
 * (MLD_ADDR_BITS: 47 bits on x86-64, 48 on aarch64, where mmap hands out addresses just below 2^48). */
#include "core/core.h"
#include <stdio.h>

int main(void) {
  int failures = 0;
  const uintptr_t top = (uintptr_t)1 << MLD_ADDR_BITS;
  /* The highest granule a segment can start at, and one in the upper half of the space. */
  const uintptr_t probes[] = { top - MLD_SEGMENT_SIZE, top / 2 + 7 * (uintptr_t)MLD_SEGMENT_SIZE };
  for (unsigned i = 0; i < sizeof probes / sizeof probes[0]; i++) {
    const void *seg = (const void *)probes[i];
    mld_owner_set(seg, true);   /* the map only: nothing is read at the address */
    if (!mld_owned(seg)) { fprintf(stderr, "FAIL: a segment at %p is not covered\n", seg); failures++; }
    mld_owner_set(seg, false);
    if (mld_owned(seg)) { fprintf(stderr, "FAIL: the bit of %p stays set\n", seg); failures++; }
  }
#if defined(__aarch64__)
  if (MLD_ADDR_BITS < 48) { fprintf(stderr, "FAIL: aarch64 maps user memory up to 2^48\n"); failures++; }
#endif
  printf("ownership map: %d address bits\n", MLD_ADDR_BITS);
  return failures != 0;
}
