/* leaky.c — for the prof_leak tests: `leaky leak` leaves 4 MiB live in 512 blocks allocated by leaky_site; `leaky
 * clean` allocates the same (and more, through realloc and a huge block) and frees everything. */
#include <stdlib.h>
#include <string.h>

static void *blocks[512];

__attribute__((noinline)) void leaky_site(void) {
  for (int i = 0; i < 512; i++) { blocks[i] = malloc(8192); memset(blocks[i], 1, 8192); }
}

int main(int argc, char **argv) {
  leaky_site();
  if (argc > 1 && !strcmp(argv[1], "leak")) return 0;
  for (int i = 0; i < 512; i++) blocks[i] = realloc(blocks[i], 20000 + (size_t)i);   /* sampled blocks move */
  void *huge[8];
  for (int i = 0; i < 8; i++) huge[i] = malloc(8 << 20);   /* neighbours: growing in place is unlikely */
  for (int i = 0; i < 8; i++) huge[i] = realloc(huge[i], 40 << 20);   /* moved by mremap: the record follows */
  for (int i = 0; i < 8; i++) free(huge[i]);
  for (int i = 0; i < 512; i++) free(blocks[i]);
  return 0;
}
