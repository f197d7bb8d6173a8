/* test_prof_ctl.c — the prof.* ctl names: reads, writes, refusals, reset and dump; argv[1] "on" (prof:true) or "off". */
#include "mtest.h"
#include <sys/stat.h>

static int wr(const char *name, void *v, size_t n) { return MT_CTL(name, NULL, NULL, v, n); }
static uint64_t u64(const char *name) {
  uint64_t v = 0;
  size_t l = sizeof v;
  CHECK(MT_CTL(name, &v, &l, NULL, 0) == 0, "%s", name);
  return v;
}

int main(int argc, char **argv) {
  bool on = argc > 1 && !strcmp(argv[1], "on");
  bool b = true, old;
  size_t bl = sizeof b, sl = sizeof(size_t), mean = 4096, got;
  CHECK(MT_CTL("opt.prof", &old, &bl, NULL, 0) == 0 && old == on, "opt.prof");
  if (!on) {
    CHECK(wr("prof.active", &b, sizeof b) == EPERM, "prof.active write with prof:false");
    const char *path = NULL;
    CHECK(wr("prof.dump", &path, sizeof path) == EPERM, "prof.dump with prof:false");
    CHECK(MT_CTL("prof.reset", NULL, NULL, NULL, 0) == EPERM, "prof.reset with prof:false");
    for (int i = 0; i < 10000; i++) M_free(M_malloc(1000));
    CHECK(u64("prof.stats.samples") == 0, "no samples with prof:false");
    return mt_result("prof_ctl_off");
  }
  CHECK(MT_CTL("prof.sample", &got, &sl, NULL, 0) == 0 && got == 512 * 1024, "default prof.sample %zu", got);
  CHECK(MT_CTL("prof.sample", &got, &sl, &mean, sizeof mean) == 0 && got == 512 * 1024, "prof.sample write");
  size_t zero = 0;
  CHECK(wr("prof.sample", &zero, sizeof zero) == EINVAL, "prof.sample 0");
  CHECK(wr("prof.sample", &mean, 4) == EINVAL, "prof.sample short");
  CHECK(MT_CTL("prof.sample", &got, &sl, NULL, 0) == 0 && got == 4096, "prof.sample now %zu", got);
  /* inactive: nothing sampled */
  b = false;
  CHECK(MT_CTL("prof.active", &old, &bl, &b, sizeof b) == 0 && old, "prof.active off");
  CHECK(MT_CTL("prof.reset", NULL, NULL, NULL, 0) == 0, "reset");
  for (int i = 0; i < 10000; i++) M_free(M_malloc(1000));
  CHECK(u64("prof.stats.samples") == 0, "samples while inactive: %llu", (unsigned long long)u64("prof.stats.samples"));
  b = true;
  CHECK(wr("prof.active", &b, sizeof b) == 0, "prof.active on");
  void *keep[100];
  for (int i = 0; i < 100; i++) keep[i] = M_malloc(100000);   /* 10 MB at 4 KiB: every one sampled */
  CHECK(u64("prof.stats.samples") >= 100, "samples %llu", (unsigned long long)u64("prof.stats.samples"));
  CHECK(u64("prof.stats.live") >= 100, "live %llu", (unsigned long long)u64("prof.stats.live"));
  CHECK(u64("prof.stats.bytes_sampled") >= 100 * 100000, "bytes_sampled");
  CHECK(u64("prof.stats.stacks") >= 1 && u64("prof.stats.metadata") > 0, "stacks, metadata");
  for (int i = 0; i < 100; i++) M_free(keep[i]);
  CHECK(u64("prof.stats.live") < 5, "live after frees %llu", (unsigned long long)u64("prof.stats.live"));
  /* dumps: to a path, and to the automatic name */
  char path[256];
  snprintf(path, sizeof path, "/tmp/mallard_prof_ctl.%d.pb.gz", (int)getpid());
  const char *p = path;
  uint64_t d0 = u64("prof.stats.dumps");
  CHECK(wr("prof.dump", &p, sizeof p) == 0, "prof.dump path");
  struct stat st;
  CHECK(stat(path, &st) == 0 && st.st_size > 0, "dump file");
  unlink(path);
  const char *bad = "/nonexistent/dir/x.pb.gz";
  CHECK(wr("prof.dump", &bad, sizeof bad) == EFAULT, "prof.dump to an impossible path");
  CHECK(u64("prof.stats.dumps") == d0 + 1, "dumps counted");
  /* reset with a rate */
  size_t r = 8192;
  CHECK(wr("prof.reset", &r, sizeof r) == 0, "reset 8192");
  CHECK(u64("prof.stats.samples") == 0 && u64("prof.stats.live") == 0, "reset forgets");
  CHECK(MT_CTL("prof.sample", &got, &sl, NULL, 0) == 0 && got == 8192, "reset sets the rate");
  return mt_result("prof_ctl");
}
