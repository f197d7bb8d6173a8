/* test_first_call.c — the very first allocation of a process, made before the allocator's initialisation, gets a
 * block of the right size. Prefix and static modes: a constructor of priority 101 runs before libmallard's
 * default-priority one, and checks that nothing is initialised yet. Preload mode: first_call_early.so, listed after
 * libmallard.so in LD_PRELOAD, is initialised before it (ld.so runs the constructors of preloaded libraries in reverse
 * order) and makes the first calls; the order is proven from ld.so's own trace (LD_DEBUG=files) of a re-run. */
#include "mtest.h"
#include <sys/wait.h>

#ifndef MT_PRELOAD
#include "core/core.h"
static uint8_t *early_block[4];
static const size_t early_size[4] = { 1000, 37, 5000, 200 };
static int state_before = -1, state_after = -1;

__attribute__((constructor(101))) static void first_calls(void) {
  state_before = atomic_load(&mld_initialized);   /* a hidden variable, reachable in a static link */
  for (int i = 0; i < 4; i++) {
    early_block[i] = M_malloc(early_size[i]);
    if (early_block[i]) memset(early_block[i], 0xA0 + i, early_size[i]);
  }
  state_after = atomic_load(&mld_initialized);
}
#define EARLY(i) early_block[i]
#define EARLY_SIZE(i) early_size[i]
#else
#define EARLY(i) (((uint8_t **)mt_sym("mt_early_block"))[i])
#define EARLY_SIZE(i) (((const size_t *)mt_sym("mt_early_size"))[i])

/* The line of ld.so's trace "calling init: <path>" whose path contains name, or NULL. */
static const char *init_line(const char *buf, const char *name) {
  for (const char *l = strstr(buf, "calling init: "); l; l = strstr(l + 1, "calling init: ")) {
    const char *eol = strchr(l, '\n');
    const char *hit = strstr(l, name);
    if (hit && (!eol || hit < eol)) return l;
  }
  return NULL;
}

/* Re-runs this program with LD_DEBUG=files: ld.so must have called the early library's constructor before
 * libmallard.so's. */
static void check_init_order(const char *self) {
  static char buf[1 << 16];
  const char *env[] = { "LD_DEBUG=files", "MT_FIRST_CALL_CHILD=1", NULL };
  int st = mt_rerun(self, env, buf, sizeof buf);
  REQUIRE(st >= 0, "pipe or fork failed");
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the re-run failed (status %d): %s", st, buf);
  const char *early = init_line(buf, "first_call_early"), *mallard = init_line(buf, "/libmallard.so");
  CHECK(early && mallard, "ld.so's trace lacks a constructor call (early %d, libmallard %d):\n%s", early != NULL,
        mallard != NULL, buf);
  CHECK(!early || !mallard || early < mallard, "libmallard.so was initialised first: the early calls came after it");
}
#endif

int main(int argc, char **argv) {
  (void)argc;
  (void)argv;
#ifndef MT_PRELOAD
  CHECK(state_before == 0, "the allocator was already initialised (state %d) before the first call", state_before);
  CHECK(state_after == 2, "the first call did not initialise the allocator (state %d)", state_after);
#elif defined(__GLIBC__)
  if (!getenv("MT_FIRST_CALL_CHILD")) check_init_order(argv[0]);
#else
  /* musl's loader keeps no trace (no LD_DEBUG): the order is not proven; the early blocks are still checked. */
  (void)check_init_order;
#endif
  for (int i = 0; i < 4; i++) {
    REQUIRE(EARLY(i), "early malloc(%zu) failed", EARLY_SIZE(i));
    CHECK(MT_OWNS(EARLY(i)), "early block %d is not Mallard's", i);
    CHECK(M_usable(EARLY(i)) >= EARLY_SIZE(i), "early malloc(%zu): usable size %zu", EARLY_SIZE(i),
          M_usable(EARLY(i)));
  }
  /* Later blocks must not overlap the early ones: fill them and check the early contents survived. */
  void *later[64];
  for (int i = 0; i < 64; i++) {
    later[i] = M_malloc(16 + (size_t)i * 24);
    REQUIRE(later[i], "malloc");
    memset(later[i], 0x55, 16 + (size_t)i * 24);
  }
  for (int i = 0; i < 4; i++)
    for (size_t k = 0; k < EARLY_SIZE(i); k++)
      if (EARLY(i)[k] != (uint8_t)(0xA0 + i)) { CHECK(0, "early block %d damaged at %zu", i, k); break; }
  for (int i = 0; i < 64; i++) M_free(later[i]);
  for (int i = 0; i < 4; i++) M_free(EARLY(i));
  return mt_result("test_first_call (" MT_MODE ")");
}
