/* test_compat_conf.c — jemalloc's `malloc_conf` symbol read by a preloaded Mallard, below MALLOC_CONF and MALLARD_CONF. */
#include "mtest.h"
#include <jemalloc/jemalloc.h>
#include <sys/types.h>

/* jemalloc's documented way for a program to set its options; tcache has no Mallard meaning (ignored). */
const char *malloc_conf = "dirty_decay_ms:7000,tcache:false";

int main(int argc, char **argv) {
  REQUIRE(argc == 2, "usage: test_compat_conf EXPECTED_DIRTY_DECAY_MS");
  ssize_t want = strtol(argv[1], NULL, 10), got = 0;
  size_t len = sizeof got;
  const char *v = NULL;
  size_t vl = sizeof v;
  REQUIRE(mallctl("version", &v, &vl, NULL, 0) == 0 && !strcmp(v, MALLARD_VERSION), "mallctl is not Mallard's");
  CHECK(mallctl("opt.dirty_decay_ms", &got, &len, NULL, 0) == 0 && got == want, "opt.dirty_decay_ms %zd, want %zd",
        got, want);
  return mt_result("compat_conf");
}
