/* test_owner_probe.c — mallard_owns of addresses whose memory another thread maps, moves and unmaps (issue 14,
 * item 5b): it used to read the header of a segment found in the ownership map after that segment could have been
 * unmapped (a fault; under ThreadSanitizer a race). Run with dirty_decay_ms:0,retain:false so that freed huge blocks
 * and emptied segments are unmapped at once. The churning thread checks its own blocks' answers; the probing
 * threads only must neither fault nor race. */
#include "mtest.h"
#include <pthread.h>

#define MiB ((size_t)1024 * 1024)
enum { NTARGETS = 4, NPROBERS = 2 };

static _Atomic(uintptr_t) target[NTARGETS];   /* blocks of the churner, live or already freed */
static _Atomic(int) stop;
static _Atomic(uint64_t) probes;

static void *churner(void *arg) {
  double end = mt_now() + *(double *)arg;
  int i = 0;
  for (; mt_now() < end; i++) {
    uint8_t *h = M_malloc(3 * MiB);   /* huge: its own mapping */
    REQUIRE(h, "malloc(3 MiB) (iteration %d)", i);
    atomic_store(&target[0], (uintptr_t)h);
    for (int k = 0; k < 4; k++) {     /* resized by mremap: moved when the space above is taken, else in place */
      h = M_realloc(h, (size_t)(6 - k % 2) * MiB);
      REQUIRE(h, "realloc (iteration %d)", i);
      atomic_store(&target[0], (uintptr_t)h);
      atomic_store(&target[1], (uintptr_t)(h + 4 * MiB));
    }
    uint8_t *l1 = M_malloc(2 * MiB);  /* large: 32 slots; two of them do not fit one segment */
    uint8_t *l2 = M_malloc(2 * MiB);
    REQUIRE(l1 && l2, "malloc(2 MiB) (iteration %d)", i);
    atomic_store(&target[2], (uintptr_t)l1);
    atomic_store(&target[3], (uintptr_t)l2);
    h[0] = l1[0] = l2[0] = 1;
    CHECK(MT_OWNS(h) && MT_OWNS(h + 4 * MiB) && MT_OWNS(h + 5 * MiB - 1), "owns(live huge block) false (%d)", i);
    CHECK(MT_OWNS(l1 + 2 * MiB - 1) && MT_OWNS(l2 + MiB), "owns(live large block) false (%d)", i);
    M_free(h);
    M_free(l1);
    M_free(l2);
    /* Unmapped (huge) or released / free again (large): nobody else allocates here. */
    CHECK(!MT_OWNS(h) && !MT_OWNS(h + 4 * MiB), "owns(freed huge block) true (%d)", i);
    CHECK(!MT_OWNS(l1 + MiB) && !MT_OWNS(l2 + MiB), "owns(freed large block) true (%d)", i);
  }
  printf("churner: %d rounds\n", i);
  atomic_store(&stop, 1);
  return NULL;
}

/* Probes the churner's blocks, their segments' headers and the granules around them. Allocates nothing. */
static void *prober(void *arg) {
  (void)arg;
  uint64_t n = 0;
  while (!atomic_load(&stop)) {
    for (int t = 0; t < NTARGETS; t++) {
      uintptr_t p = atomic_load(&target[t]);
      if (!p) continue;
      uintptr_t seg = p & ~(uintptr_t)(4 * MiB - 1);
      const uintptr_t probe[] = { p, p + 4096, seg, seg + 64 * 1024 + 8, seg + 4 * MiB + 100, seg - 4 * MiB + 100 };
      for (size_t k = 0; k < sizeof probe / sizeof probe[0]; k++) n += MT_OWNS((const void *)probe[k]);
    }
  }
  atomic_fetch_add(&probes, n);
  return NULL;
}

int main(int argc, char **argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 1.5;
  pthread_t c, p[NPROBERS];
  for (int i = 0; i < NPROBERS; i++) REQUIRE(pthread_create(&p[i], NULL, prober, NULL) == 0, "pthread_create");
  REQUIRE(pthread_create(&c, NULL, churner, &seconds) == 0, "pthread_create");
  pthread_join(c, NULL);
  for (int i = 0; i < NPROBERS; i++) pthread_join(p[i], NULL);
  printf("probes answered true: %llu\n", (unsigned long long)atomic_load(&probes));
  return mt_result("test_owner_probe[" MT_MODE "]");
}
