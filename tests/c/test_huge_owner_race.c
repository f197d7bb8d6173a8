/* test_huge_owner_race.c — huge reallocs that move, while another thread maps new huge blocks: every live block
 * stays Mallard's (item 4: the old range's ownership bit was cleared after mremap had released it, so a block
 * mapped there meanwhile lost its bit: usable size 0, realloc NULL, free ignored). Run with huge_cache_max:0 so
 * that every huge block is a fresh mapping; the race-delay build widens the window around mremap. */
#include "mtest.h"
#include <pthread.h>
#include <stdarg.h>

static _Atomic(int) stop;
enum { ITER = 3000 };

__attribute__((unused)) static void *mover(void *arg) {
  (void)arg;
  mt_rng_t r;
  mt_rng_seed(&r, 42);
  uint8_t *p = M_malloc(4u << 20);
  REQUIRE(p, "malloc");
  for (int i = 0; i < ITER && !atomic_load(&stop); i++) {
    size_t n = (size_t)(3 + mt_rng_below(&r, 14)) << 20;   /* 3..16 MiB: grows often move the mapping */
    uint8_t *q = M_realloc(p, n);
    REQUIRE(q, "realloc(%zu)", n);
    q[0] = 1;
    q[n - 1] = 2;
    p = q;
  }
  M_free(p);
  return NULL;
}

__attribute__((unused)) static void *mapper(void *arg) {
  (void)arg;
  for (int i = 0; i < ITER && !atomic_load(&stop); i++) {
    uint8_t *q = M_malloc(3u << 20);
    REQUIRE(q, "malloc(3 MiB)");
    q[0] = 3;
    size_t u = M_usable(q);
    CHECK(u >= (3u << 20), "a live huge block reads as foreign: usable size %zu (iteration %d)", u, i);
    CHECK(MT_OWNS(q), "mallard_owns(live huge block) false (iteration %d)", i);
    if (u < (3u << 20)) { atomic_store(&stop, 1); break; }
    M_free(q);
  }
  return NULL;
}

#ifdef MT_WRAP_MREMAP
/* Deterministic variant (static link, --wrap=mmap,--wrap=mremap): right after a mremap has moved a huge block away,
 * another thread maps a huge block exactly where the old one was (the mmap wrapper steers its address there),
 * and only then does the realloc finish. That block must still be Mallard's afterwards. */
#include <sys/mman.h>
void *__real_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off);
void *__real_mremap(void *old, size_t old_len, size_t new_len, int flags, ...);
static void *_Atomic steer;          /* where the next mapping of the other thread must land */
static uint8_t *_Atomic landed;      /* the block the other thread got there */

void *__wrap_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
  void *want = atomic_exchange(&steer, NULL);
  if (want) return __real_mmap(want, len, prot, flags | MAP_FIXED_NOREPLACE, fd, off);
  return __real_mmap(addr, len, prot, flags, fd, off);
}

static void *land(void *arg) {
  atomic_store(&steer, arg);
  uint8_t *q = M_malloc(3u << 20);
  REQUIRE(q, "malloc(3 MiB) in the other thread");
  atomic_store(&landed, q);
  return NULL;
}

void *__wrap_mremap(void *old, size_t old_len, size_t new_len, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  void *dst = (flags & MREMAP_FIXED) ? va_arg(ap, void *) : NULL;
  va_end(ap);
  void *r = (flags & MREMAP_FIXED) ? __real_mremap(old, old_len, new_len, flags, dst) : __real_mremap(old, old_len, new_len, flags);
  if (r != MAP_FAILED && r != old && !atomic_load(&landed)) {   /* moved: the old range is free now */
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, land, old) == 0, "pthread_create");
    pthread_join(t, NULL);
  }
  return r;
}

int main(void) {
  /* Block the space right after a huge block, so that growing it must move it. */
  uint8_t *p = M_malloc(3u << 20);
  REQUIRE(p, "malloc");
  void *wall = __real_mmap(p + (4u << 20), 8u << 20, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  uint8_t *q = M_realloc(p, 10u << 20);
  REQUIRE(q, "realloc(10 MiB)");
  uint8_t *l = atomic_load(&landed);
  REQUIRE(l, "the realloc did not move the block (wall %p, block %p)", wall, (void *)p);
  CHECK(M_usable(l) >= (3u << 20), "the block mapped at the old place reads as foreign (usable size %zu)", M_usable(l));
  CHECK(M_usable(q) >= (10u << 20), "the moved block reads as foreign (usable size %zu)", M_usable(q));
  M_free(l);
  M_free(q);
  return mt_result("test_huge_owner_race[static, steered]");
}
#else
int main(void) {
  pthread_t t[4];
  REQUIRE(pthread_create(&t[0], NULL, mover, NULL) == 0, "pthread_create");
  REQUIRE(pthread_create(&t[1], NULL, mover, NULL) == 0, "pthread_create");
  REQUIRE(pthread_create(&t[2], NULL, mapper, NULL) == 0, "pthread_create");
  REQUIRE(pthread_create(&t[3], NULL, mapper, NULL) == 0, "pthread_create");
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  return mt_result("test_huge_owner_race[" MT_MODE "]");
}
#endif
