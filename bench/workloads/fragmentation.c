/* Fragmentation over time: phases with different size mixes, 90% of each phase freed, RSS after each phase and after everything is freed. */
#include "common.h"

struct obj {
  void *p;
  size_t n;
  uint64_t tag;
};

/* One phase of the program's life: which sizes it allocates and how many objects (as a share of -s). */
struct phase {
  const char *name;
  size_t lo, hi;
  int log;       /* log-uniform when set, uniform otherwise */
  int divisor;   /* objects = size / divisor */
};

static const struct phase phases[] = {
    {"small", 16, 64, 0, 1},       {"medium", 64, 1024, 0, 2},  {"mixed", 16, 16384, 1, 4},
    {"large", 16384, 262144, 1, 64}, {"small-again", 24, 200, 0, 1},
};
#define NPHASES (int)(sizeof phases / sizeof phases[0])

int main(int argc, char **argv) {
  struct bench_opts o = {.threads = 1, .iters = 1, .size = 200000, .seed = 1, .wait_ms = 0};
  bench_parse(argc, argv, &o,
              "fragmentation: -s objects in the first phase, -n passes over the phases, -w ms to wait after freeing all "
              "(threads ignored)");
  uint64_t rng = rng_seed(o.seed, 0);
  long total = 0;
  for (int k = 0; k < NPHASES; k++) total += o.size / phases[k].divisor + 1;
  total *= o.iters > 0 ? o.iters : 1;
  /* Survivors of every phase stay alive until the end, so the allocator must reuse the holes they leave. */
  struct obj *kept = xmalloc((size_t)total * sizeof *kept);
  struct obj *cur = xmalloc((size_t)(o.size + 1) * sizeof *cur);
  long nkept = 0, ops = 0;
  long rss_start = proc_status_kib("VmRSS");
  char after_alloc[1024] = "", after_free[1024] = "";
  size_t la = 0, lf = 0;
  double t0 = now_s();
  for (long pass = 0; pass < (o.iters > 0 ? o.iters : 1); pass++) {
    for (int k = 0; k < NPHASES; k++) {
      const struct phase *ph = &phases[k];
      long n = o.size / ph->divisor + 1;
      for (long i = 0; i < n; i++) {
        cur[i].n = ph->log ? rng_log(&rng, ph->lo, ph->hi) : rng_range(&rng, ph->lo, ph->hi);
        cur[i].tag = rng_next(&rng);
        cur[i].p = xmalloc(cur[i].n);
        pat_fill(cur[i].p, cur[i].n, cur[i].tag);
      }
      long rss_a = proc_status_kib("VmRSS");
      /* Free a random 90%, keep the rest. */
      for (long i = 0; i < n; i++) {
        if (rng_next(&rng) % 10 == 0) {
          kept[nkept++] = cur[i];
        } else {
          pat_check(cur[i].p, cur[i].n, cur[i].tag, "fragmentation");
          free(cur[i].p);
        }
      }
      ops += n;
      long rss_f = proc_status_kib("VmRSS");
      la += (size_t)snprintf(after_alloc + la, sizeof after_alloc - la, "%s%ld", la ? ", " : "", rss_a);
      lf += (size_t)snprintf(after_free + lf, sizeof after_free - lf, "%s%ld", lf ? ", " : "", rss_f);
      if (la >= sizeof after_alloc - 32 || lf >= sizeof after_free - 32) la = lf = 0; /* many passes: keep the last */
    }
  }
  long rss_kept = proc_status_kib("VmRSS");
  for (long i = 0; i < nkept; i++) {
    pat_check(kept[i].p, kept[i].n, kept[i].tag, "fragmentation-final");
    free(kept[i].p);
  }
  /* "Everything freed" includes the workload's own bookkeeping arrays. */
  free(kept);
  free(cur);
  double secs = now_s() - t0;
  long rss_freed = proc_status_kib("VmRSS");
  if (o.wait_ms) bench_sleep_ms(o.wait_ms);
  long rss_waited = proc_status_kib("VmRSS");
  bench_result("fragmentation", &o, ops, secs,
               "\"phases\": %d, \"rss_start_kib\": %ld, \"rss_after_alloc_kib\": [%s], \"rss_after_phase_kib\": [%s], "
               "\"rss_with_survivors_kib\": %ld, \"rss_all_freed_kib\": %ld, \"rss_after_wait_kib\": %ld, "
               "\"wait_ms\": %ld",
               NPHASES, rss_start, after_alloc, after_free, rss_kept, rss_freed, rss_waited, o.wait_ms);
  return 0;
}
