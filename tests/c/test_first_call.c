/* test_first_call.c — the very first allocation of a process (before any initialisation) gets a block of the right size. */
#include "mtest.h"

static uint8_t *early[4];
static size_t early_size[4] = { 1000, 37, 5000, 200 };

/* Runs before main and before the allocator's own constructor would: the first call initialises everything. */
__attribute__((constructor(101))) static void first_calls(void) {
  for (int i = 0; i < 4; i++) {
    early[i] = M_malloc(early_size[i]);
    if (early[i]) memset(early[i], 0xA0 + i, early_size[i]);
  }
}

int main(void) {
  for (int i = 0; i < 4; i++) {
    REQUIRE(early[i], "early malloc(%zu) failed", early_size[i]);
    CHECK(M_usable(early[i]) >= early_size[i], "early malloc(%zu): usable size %zu", early_size[i], M_usable(early[i]));
  }
  /* Later blocks must not overlap the early ones: fill them and check the early contents survived. */
  void *later[64];
  for (int i = 0; i < 64; i++) {
    later[i] = M_malloc(16 + (size_t)i * 24);
    memset(later[i], 0x55, 16 + (size_t)i * 24);
  }
  for (int i = 0; i < 4; i++)
    for (size_t k = 0; k < early_size[i]; k++)
      if (early[i][k] != (uint8_t)(0xA0 + i)) { CHECK(0, "early block %d damaged at %zu", i, k); break; }
  for (int i = 0; i < 64; i++) M_free(later[i]);
  for (int i = 0; i < 4; i++) M_free(early[i]);
  return mt_result("test_first_call");
}
