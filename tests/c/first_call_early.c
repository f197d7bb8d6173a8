/* first_call_early.c — a library preloaded after libmallard.so: its constructor runs first and makes the process's
 * first allocations, before libmallard's own constructor has initialised anything. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Read by test_first_call (preload mode) through dlsym. */
__attribute__((visibility("default"))) uint8_t *mt_early_block[4];
__attribute__((visibility("default"))) const size_t mt_early_size[4] = { 1000, 37, 5000, 200 };

__attribute__((constructor)) static void early_calls(void) {
  for (int i = 0; i < 4; i++) {
    mt_early_block[i] = malloc(mt_early_size[i]);
    if (mt_early_block[i]) memset(mt_early_block[i], 0xA0 + i, mt_early_size[i]);
  }
}
