/* secure.c — the secure variant's secret, randomness and failure report (compiled empty in the fast variant). */
#define _GNU_SOURCE
#include "internal.h"
#include "secure.h"

#ifdef MALLARD_SECURE
#include <stdlib.h>
#include <sys/random.h>
#include <time.h>

uintptr_t mld_secret;
static __thread uint64_t rng_state;

void mld_secure_init(void) {
  uintptr_t s = 0;
  if (getrandom(&s, sizeof s, GRND_NONBLOCK) != (ssize_t)sizeof s) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    s = (uintptr_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uintptr_t)&s;
  }
  mld_secret = s | 1;   /* never zero: a zero key would store links in clear */
}

static uint64_t rng_next(void) {
  if (!rng_state) rng_state = (uint64_t)mld_secret ^ (uint64_t)(uintptr_t)&rng_state;
  uint64_t x = rng_state;   /* xorshift64 */
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return rng_state = x;
}

/* Fisher-Yates: freshly carved blocks are handed out in random order. */
void mld_shuffle(block_t **blocks, size_t n) {
  for (size_t i = n; i > 1; i--) {
    size_t j = (size_t)(rng_next() % i);
    block_t *t = blocks[i - 1];
    blocks[i - 1] = blocks[j];
    blocks[j] = t;
  }
}

uintptr_t mld_random_hint(void) {
  /* A random 4 MiB-aligned address between 1 TiB and 64 TiB: segment addresses are not predictable. */
  uint64_t r = rng_next();
  return (uintptr_t)((((r % ((1ull << 46) - (1ull << 40))) + (1ull << 40)) >> MLD_SEGMENT_SHIFT) << MLD_SEGMENT_SHIFT);
}

void mld_secure_fail(const char *what, const void *p) {
  mld_fatal("mallard-secure: %s %p; aborting\n", what, p);
}
#endif
