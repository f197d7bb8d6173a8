/* test_prof_unbiased.c — the profiler's estimates are unbiased: for block sizes from 16 B to 1 MiB, the estimated bytes
 * and blocks allocated and in use match the truth within 4 standard deviations of the sampling estimator (fixed seed:
 * prof_seed; the variance of K allocations of s bytes sampled with p = 1 - exp(-s/T) and weighted 1/p is
 * K s^2 (1-p)/p for bytes, K (1-p)/p for blocks). */
#include "mtest.h"
#include "prof/prof.h"
#include <math.h>
#include <sys/mman.h>

typedef struct tot_s { double ao, as, io, is; } tot_t;

static tot_t totals(void) {
  prof_snap_t *a;
  size_t bytes, n = mld_prof_snapshot(&a, &bytes);
  tot_t t = { 0, 0, 0, 0 };
  for (size_t i = 0; i < n; i++) { t.ao += a[i].ao; t.as += a[i].as; t.io += a[i].io; t.is += a[i].is; }
  if (a) munmap(a, bytes);
  return t;
}

static double zsum;   /* alloc_space z-scores summed over sizes: independent, so its sd is sqrt(number of sizes) */
static unsigned nz;

static int within(const char *what, size_t s, double est, double truth, double sd) {
  double z = sd > 0 ? (est - truth) / sd : (est == truth ? 0 : 1e9);
  printf("  %-12s size %8zu: estimate %14.0f truth %14.0f z %+.2f\n", what, s, est, truth, z);
  CHECK(fabs(z) <= 4 || fabs(est - truth) <= 1e-6 * truth, "%s for %zu-byte blocks: z = %.2f", what, s, z);
  return fabs(z) <= 4;
}

int main(void) {
  size_t T = mld_prof_mean();
  REQUIRE(mld_prof_opt.prof && T == 65536, "run with MALLARD_CONF=prof:true,prof_sample:64k,prof_seed:N");
  static void *blocks[1 << 22];
  for (size_t s = 16; s <= (1u << 20); s *= 4) {
    size_t K = ((size_t)64 << 20) / s;   /* 64 MiB of each size */
    if (K > sizeof blocks / sizeof blocks[0]) K = sizeof blocks / sizeof blocks[0];
    REQUIRE(mld_prof_reset(0), "reset");
    for (size_t i = 0; i < K; i++) REQUIRE(blocks[i] = malloc(s), "malloc");
    tot_t live = totals();
    for (size_t i = 0; i < K; i++) free(blocks[i]);
    tot_t after = totals();
    double p = 1 - exp(-(double)s / (double)T);
    double vk = (double)K * (1 - p) / p, sd_n = sqrt(vk), sd_b = (double)s * sqrt(vk);
    printf("size %zu: %zu blocks, p = %.6f\n", s, K, p);
    within("alloc_space", s, after.as, (double)K * s, sd_b);
    if (sd_b > 0) { zsum += (after.as - (double)K * s) / sd_b; nz++; }
    within("alloc_objs", s, after.ao, (double)K, sd_n);
    within("inuse_space", s, live.is, (double)K * s, sd_b);
    within("inuse_objs", s, live.io, (double)K, sd_n);
    CHECK(after.is == 0 && after.io == 0, "in use after every block was freed: %.0f bytes, %.0f blocks", after.is, after.io);
  }
  /* a small bias common to all sizes: the pooled z-score */
  printf("pooled z %.2f over %u sizes\n", zsum / sqrt(nz), nz);
  CHECK(fabs(zsum / sqrt(nz)) <= 4, "pooled z = %.2f", zsum / sqrt(nz));
  return mt_result("prof_unbiased");
}
