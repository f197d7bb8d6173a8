/* test_compat.c — jemalloc's mallctl API and glibc's introspection answered by a preloaded Mallard (the program is linked with -ljemalloc). */
#include "mtest.h"
#include <jemalloc/jemalloc.h>
#include <malloc.h>
#include <sys/types.h>

/* mallinfo is deprecated in glibc's header, and is what this test checks. */
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

/* Debian's jemalloc.h names these as plain mallctl...; MALLCTL_ARENAS_ALL is jemalloc's 4096. */
#ifndef MALLCTL_ARENAS_ALL
#define MALLCTL_ARENAS_ALL 4096
#endif

/* Reads name through mallctl and through mallctlbymib (same value expected when stable); returns mallctl's. */
static size_t rd_size(const char *name) {
  size_t v = 0, v2 = 0, len = sizeof v, mib[8], miblen = 8;
  CHECK(mallctl(name, &v, &len, NULL, 0) == 0, "mallctl(%s) failed", name);
  CHECK(mallctlnametomib(name, mib, &miblen) == 0, "mallctlnametomib(%s) failed", name);
  len = sizeof v2;
  CHECK(mallctlbymib(mib, miblen, &v2, &len, NULL, 0) == 0, "mallctlbymib(%s) failed", name);
  size_t wrong = sizeof v + 1;
  CHECK(mallctl(name, &v2, &wrong, NULL, 0) == EINVAL, "mallctl(%s) with a wrong length is not EINVAL", name);
  wrong = sizeof(unsigned);
  CHECK(mallctl(name, &v2, &wrong, NULL, 0) == EINVAL, "mallctl(%s) with an unsigned's length is not EINVAL", name);
  return v;
}

/* A typed read that must succeed, plus the wrong-length check. */
#define RD(T, name, out)                                                                         \
  do {                                                                                           \
    size_t l_ = sizeof(T), w_ = sizeof(T) + 1;                                                   \
    CHECK(mallctl(name, &(out), &l_, NULL, 0) == 0, "mallctl(%s) failed", name);                 \
    char big_[sizeof(T) + 1];                                                                    \
    CHECK(mallctl(name, big_, &w_, NULL, 0) == EINVAL, "mallctl(%s) wrong length not EINVAL", name); \
  } while (0)

static size_t mallard_size(const char *name) {
  size_t v = 0, len = sizeof v;
  CHECK(MT_CTL(name, &v, &len, NULL, 0) == 0, "mallard_ctl(%s) failed", name);
  return v;
}

static void refresh(void) {
  uint64_t e = 1;
  size_t len = sizeof e;
  CHECK(mallctl("epoch", &e, &len, &e, len) == 0, "epoch refresh failed");
}

static void test_names(void) {
  const char *version = NULL;
  RD(const char *, "version", version);
  REQUIRE(version && !strcmp(version, MALLARD_VERSION), "mallctl answered by jemalloc (%s), not Mallard",
          version ? version : "NULL");
  uint64_t e1 = 0, e2 = 0;
  RD(uint64_t, "epoch", e1);
  refresh();
  RD(uint64_t, "epoch", e2);
  CHECK(e2 > e1, "epoch did not advance (%llu -> %llu)", (unsigned long long)e1, (unsigned long long)e2);
  const char *stats[] = { "stats.allocated", "stats.active", "stats.resident", "stats.mapped", "stats.retained",
                          "stats.metadata" };
  size_t v[6];
  for (int i = 0; i < 6; i++) {
    v[i] = rd_size(stats[i]);
    size_t m = mallard_size(stats[i]);
    CHECK(v[i] > 0 || i == 4, "%s is 0", stats[i]);
    CHECK(v[i] <= m + (1 << 20) && m <= v[i] + (1 << 20), "%s: mallctl %zu, mallard_ctl %zu", stats[i], v[i], m);
  }
  CHECK(v[0] <= v[1] && v[1] <= v[2] && v[2] <= v[3], "allocated %zu <= active %zu <= resident %zu <= mapped %zu",
        v[0], v[1], v[2], v[3]);
  unsigned narenas = 0, optn = 0, nbins = 0;
  RD(unsigned, "arenas.narenas", narenas);
  RD(unsigned, "opt.narenas", optn);
  CHECK(narenas >= 1 && narenas <= 64 && optn >= 1 && optn <= narenas, "narenas %u opt.narenas %u", narenas, optn);
  ssize_t decay = 0;
  RD(ssize_t, "opt.dirty_decay_ms", decay);
  CHECK(decay == 1000, "opt.dirty_decay_ms %zd (default 1000)", decay);
  bool bg = false, bgopt = false;
  RD(bool, "opt.background_thread", bgopt);
  RD(bool, "background_thread", bg);
  CHECK(bgopt, "opt.background_thread is false by default");
  size_t page = 0;
  RD(size_t, "arenas.page", page);
  CHECK(page == mt_page(), "arenas.page %zu, the page in force %zu", page, mt_page());
  RD(unsigned, "arenas.nbins", nbins);
  CHECK(nbins > 10 && nbins < 200, "arenas.nbins %u", nbins);
  size_t bsize = 0;
  uint32_t nregs = 0;
  RD(size_t, "arenas.bin.0.size", bsize);
  RD(uint32_t, "arenas.bin.0.nregs", nregs);
  CHECK(bsize == 16 && nregs >= 1, "bin 0: size %zu nregs %u", bsize, nregs);
  /* Unknown names, or names with no Mallard meaning: ENOENT. */
  const char *none[] = { "stats.nonexistent", "opt.lg_tcache_max", "arena.0.reset", "arena.0.destroy", "prof.thread_active_init",
                         "stats.arenas.4096.bins.100000.curregs", "arenas.bin.100000.size", "arena.999.purge",
                         "thread.prof.name", "", "stats", "stats.arenas.4097.pactive", "arena.4097.purge" };
  for (size_t i = 0; i < sizeof none / sizeof none[0]; i++) {
    size_t x, l = sizeof x;
    CHECK(mallctl(none[i], &x, &l, NULL, 0) == ENOENT, "mallctl(\"%s\") is not ENOENT", none[i]);
  }
  /* opt.tcache: jemalloc's name, Mallard's option (the fast variant's thread cache, on by default; the secure
   * variant has none and reads false). */
  bool secure = false, tcache = false;
  size_t bl = sizeof secure;
  CHECK(mallctl("opt.secure", &secure, &bl, NULL, 0) == 0, "opt.secure");
  bl = sizeof tcache;
  CHECK(mallctl("opt.tcache", &tcache, &bl, NULL, 0) == 0 && tcache == !secure, "opt.tcache %d (secure %d)", tcache, secure);
  size_t mib[8], ml = 8;
  CHECK(mallctlnametomib("stats.bogus", mib, &ml) == ENOENT, "nametomib(stats.bogus) is not ENOENT");
  ml = 2;
  CHECK(mallctlnametomib("stats.arenas.0.pactive", mib, &ml) == ENOENT, "nametomib with a short array");
  size_t badmib[2] = { (size_t)1 << 62 | 9999, 0 };
  size_t x, l = sizeof x;
  CHECK(mallctlbymib(badmib, 2, &x, &l, NULL, 0) == ENOENT, "bymib with an unknown component is not ENOENT");
  CHECK(mallctlbymib(mib, 0, &x, &l, NULL, 0) == ENOENT, "bymib with miblen 0 is not ENOENT");
  CHECK(mallctl(NULL, &x, &l, NULL, 0) == EINVAL, "mallctl(NULL) is not EINVAL");
  CHECK(mallctl("stats.allocated", &x, NULL, NULL, 0) == EINVAL, "oldp without oldlenp is not EINVAL");
  CHECK(mallctl("stats.allocated", NULL, NULL, &x, sizeof x) == EPERM, "writing stats.allocated is not EPERM");
}

/* A MIB with its index changed reaches another arena, as jemalloc's documentation shows. */
static void test_mib_index(void) {
  size_t mib[8], ml = 8;
  REQUIRE(mallctlnametomib("stats.arenas.0.pactive", mib, &ml) == 0 && ml == 4, "nametomib stats.arenas.0.pactive");
  CHECK(mib[2] == 0, "an index component must be the index itself (mib[2] = %zu)", mib[2]);
  size_t one = 0, direct = 0, l = sizeof one;
  CHECK(mallctlbymib(mib, ml, &one, &l, NULL, 0) == 0, "bymib stats.arenas.0.pactive failed");
  CHECK(mallctl("stats.arenas.0.pactive", &direct, &l, NULL, 0) == 0 && one == direct,
        "bymib %zu != mallctl %zu for stats.arenas.0.pactive", one, direct);
  size_t all = 0;
  mib[2] = MALLCTL_ARENAS_ALL;
  CHECK(mallctlbymib(mib, ml, &all, &l, NULL, 0) == 0, "bymib stats.arenas.4096.pactive failed");
  size_t active = rd_size("stats.active"), page = 4096;
  CHECK(all * page <= active + (1 << 20) && active <= all * page + (1 << 20), "pactive*page %zu vs active %zu",
        all * page, active);
}

static void test_growth(void) {
  refresh();
  size_t before = rd_size("stats.allocated");
  size_t small_before = 0, l = sizeof small_before;
  CHECK(mallctl("stats.arenas.4096.small.allocated", &small_before, &l, NULL, 0) == 0, "small.allocated");
  enum { N = 10000, SZ = 1024 };   /* 10 MB in 1 KiB blocks: size classes, not large blocks */
  static void *blocks[N];
  for (int i = 0; i < N; i++) { blocks[i] = malloc(SZ); memset(blocks[i], 1, SZ); }
  refresh();
  size_t after = rd_size("stats.allocated"), small_after = 0;
  l = sizeof small_after;
  CHECK(mallctl("stats.arenas.4096.small.allocated", &small_after, &l, NULL, 0) == 0, "small.allocated");
  /* Counted in block sizes: the secure variant's canary moves 1 KiB requests into the next class (1.25 KiB). */
  size_t want = (size_t)N * SZ;
  CHECK(after >= before + want && after <= before + want + want / 3, "stats.allocated %zu -> %zu after %zu bytes",
        before, after, want);
  CHECK(small_after >= small_before + want && small_after <= small_before + want + want / 3,
        "small.allocated %zu -> %zu", small_before, small_after);
  /* The bin of these blocks holds at least N of them. */
  unsigned nbins = 0, found = 0, jfound = 0;
  RD(unsigned, "arenas.nbins", nbins);
  size_t sum = 0;
  for (unsigned j = 0; j < nbins; j++) {
    char name[96];
    size_t sz = 0, regs = 0, slabs = 0, len = sizeof sz;
    snprintf(name, sizeof name, "arenas.bin.%u.size", j);
    CHECK(mallctl(name, &sz, &len, NULL, 0) == 0, "%s", name);
    snprintf(name, sizeof name, "stats.arenas.%u.bins.%u.curregs", MALLCTL_ARENAS_ALL, j);
    len = sizeof regs;
    CHECK(mallctl(name, &regs, &len, NULL, 0) == 0, "%s", name);
    snprintf(name, sizeof name, "stats.arenas.%u.bins.%u.curslabs", MALLCTL_ARENAS_ALL, j);
    len = sizeof slabs;
    CHECK(mallctl(name, &slabs, &len, NULL, 0) == 0, "%s", name);
    if (regs >= N && sz >= SZ && slabs >= (regs * sz) / (1 << 20)) { found++; jfound = j; }
    sum += regs * sz;
  }
  CHECK(found == 1, "no bin (or several) holds the %d blocks", N);
  CHECK(sum == small_after, "sum of curregs * size %zu != small.allocated %zu", sum, small_after);
  /* mallinfo2's uordblks is stats.allocated; mallinfo's int fields the same below 2 GiB. */
  struct mallinfo2 mi2 = mallinfo2();
  CHECK(mi2.uordblks >= after - (1 << 16) && mi2.uordblks <= after + (1 << 16), "mallinfo2.uordblks %zu vs %zu",
        mi2.uordblks, after);
  CHECK(mi2.arena >= mi2.uordblks && mi2.fordblks == mi2.arena - mi2.uordblks, "mallinfo2 arena/fordblks");
  struct mallinfo mi = mallinfo();
  CHECK(mi.uordblks > 0 && (size_t)mi.uordblks >= after - (1 << 16), "mallinfo.uordblks %d", mi.uordblks);
  for (int i = 0; i < N; i++) free(blocks[i]);
  refresh();
  char bin[96];
  size_t regs_after = 0, rl = sizeof regs_after;
  snprintf(bin, sizeof bin, "stats.arenas.%u.bins.%u.curregs", MALLCTL_ARENAS_ALL, jfound);
  CHECK(mallctl(bin, &regs_after, &rl, NULL, 0) == 0 && regs_after < N / 10, "%s = %zu after freeing the blocks",
        bin, regs_after);
  size_t freed = rd_size("stats.allocated");
  CHECK(freed <= before + (1 << 16), "stats.allocated %zu after freeing everything (was %zu)", freed, before);
}

/* Past 2 GiB mallinfo's int fields saturate instead of wrapping. The block is never touched: address space only. */
static void test_mallinfo_saturates(void) {
  void *p = malloc((size_t)3 << 30);
  REQUIRE(p, "malloc(3 GiB) failed");
  struct mallinfo mi = mallinfo();
  struct mallinfo2 mi2 = mallinfo2();
  CHECK(mi2.uordblks >= ((size_t)3 << 30) && mi2.hblks >= 1 && mi2.hblkhd >= ((size_t)3 << 30),
        "mallinfo2 after 3 GiB: uordblks %zu hblks %zu hblkhd %zu", mi2.uordblks, mi2.hblks, mi2.hblkhd);
  CHECK(mi.uordblks == 2147483647 && mi.arena == 2147483647 && mi.hblkhd == 2147483647,
        "mallinfo does not saturate: uordblks %d arena %d", mi.uordblks, mi.arena);
  free(p);
}

static void test_thread_counters(void) {
  uint64_t *ap = NULL, *dp = NULL;
  RD(uint64_t *, "thread.allocatedp", ap);
  RD(uint64_t *, "thread.deallocatedp", dp);
  REQUIRE(ap && dp && ap != dp, "thread.allocatedp/deallocatedp");
  uint64_t a0 = *ap, d0 = *dp;
  void *p = malloc(1 << 20);
  free(p);
  refresh();   /* the pointed-to counters are brought up to date by the thread's mallctl calls (docs/COMPAT.md) */
  CHECK(*ap >= a0 + (1 << 20) && *dp >= d0 + (1 << 20), "allocatedp %llu -> %llu, deallocatedp %llu -> %llu",
        (unsigned long long)a0, (unsigned long long)*ap, (unsigned long long)d0, (unsigned long long)*dp);
  uint64_t a = 0, d = 0;
  RD(uint64_t, "thread.allocated", a);
  RD(uint64_t, "thread.deallocated", d);
  CHECK(a == *ap && d == *dp, "thread.allocated %llu vs *allocatedp %llu", (unsigned long long)a,
        (unsigned long long)*ap);
  CHECK(mallctl("thread.tcache.flush", NULL, NULL, NULL, 0) == 0, "thread.tcache.flush");
  unsigned idx = 0, cur = 99;
  RD(unsigned, "arenas.create", idx);
  CHECK(mallctl("thread.arena", NULL, NULL, &idx, sizeof idx) == 0, "thread.arena write");
  RD(unsigned, "thread.arena", cur);
  CHECK(cur == idx, "thread.arena %u after binding to %u", cur, idx);
}

static long rss_kb(void) { return mt_status_kb("VmRSS:"); }

/* Both "every arena" conventions purge: MALLCTL_ARENAS_ALL and Redis's arena.<narenas>.purge. */
static void test_purge(void) {
  const char *forms[2] = { "arena.4096.purge", NULL };
  char old_form[64];
  unsigned narenas = 0;
  RD(unsigned, "arenas.narenas", narenas);
  snprintf(old_form, sizeof old_form, "arena.%u.purge", narenas);
  forms[1] = old_form;
  for (int f = 0; f < 2; f++) {
    enum { N = 256 };
    static void *b[N];
    for (int i = 0; i < N; i++) { b[i] = malloc(200 * 1024); memset(b[i], 7, 200 * 1024); }   /* 50 MB, large */
    for (int i = 0; i < N; i++) free(b[i]);
    long before = rss_kb();
    CHECK(mallctl(forms[f], NULL, NULL, NULL, 0) == 0, "%s failed", forms[f]);
    long after = rss_kb();
    CHECK(after < before - 20000, "%s: RSS %ld KiB -> %ld KiB", forms[f], before, after);
  }
  CHECK(mallctl("arena.0.purge", NULL, NULL, NULL, 0) == 0, "arena.0.purge");
  CHECK(mallctl("arena.0.decay", NULL, NULL, NULL, 0) == 0, "arena.0.decay");
  CHECK(mallctl("arena.4096.decay", NULL, NULL, NULL, 0) == 0, "arena.4096.decay");
  size_t x = 0, l = sizeof x;
  CHECK(mallctl("arena.4096.purge", &x, &l, NULL, 0) == EINVAL, "arena.4096.purge with oldp is not EINVAL");
  /* background_thread: asking for what the option says succeeds; the opposite is refused. */
  bool t = true, fl = false;
  CHECK(mallctl("background_thread", NULL, NULL, &t, sizeof t) == 0, "background_thread=true refused");
  CHECK(mallctl("background_thread", NULL, NULL, &fl, sizeof fl) == EPERM, "background_thread=false not EPERM");
  CHECK(mallctl("background_thread", NULL, NULL, &t, 4) == EINVAL, "background_thread with 4 bytes not EINVAL");
}

static void collect_cb(void *opaque, const char *text) {
  size_t *n = opaque;
  if (strstr(text, "Mallard statistics") || strstr(text, "\"mallard\"")) (*n)++;
}

static void test_reports(void) {
  size_t hits = 0;
  malloc_stats_print(collect_cb, &hits, NULL);
  CHECK(hits == 1, "malloc_stats_print: text report not seen");
  hits = 0;
  malloc_stats_print(collect_cb, &hits, "Jgmdablx");
  CHECK(hits == 1, "malloc_stats_print J: JSON report not seen");
  CHECK(malloc_info(1, stdout) == EINVAL, "malloc_info(1) is not EINVAL");
  FILE *f = tmpfile();
  REQUIRE(f, "tmpfile");
  CHECK(malloc_info(0, f) == 0, "malloc_info(0) failed");
  char buf[8192] = { 0 };
  rewind(f);
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  CHECK(n > 0 && !strncmp(buf, "<malloc version=\"1\">", 20) && strstr(buf, "<heap nr=\"0\">") &&
        strstr(buf, "<system type=\"current\"") && strstr(buf, "</malloc>\n"), "malloc_info: %s", buf);
  /* malloc_stats writes to stderr (fd 2) */
  FILE *t = tmpfile();
  REQUIRE(t, "tmpfile");
  fflush(stderr);
  int saved = dup(2);
  dup2(fileno(t), 2);
  malloc_stats();
  dup2(saved, 2);
  close(saved);
  memset(buf, 0, sizeof buf);
  rewind(t);
  n = fread(buf, 1, sizeof buf - 1, t);
  fclose(t);
  CHECK(strstr(buf, "system bytes     =") && strstr(buf, "in use bytes     ="), "malloc_stats wrote: %s", buf);
}

/* Runs this program with env settings and returns its stdout+stderr. */
static void run_self(const char *self, const char *env, const char *args, char *out, size_t len) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "env %s %s %s 2>&1", env, self, args);
  FILE *p = popen(cmd, "r");
  REQUIRE(p, "popen");
  size_t n = fread(out, 1, len - 1, p);
  out[n] = 0;
  pclose(p);
}

/* MALLOC_CONF is read below MALLARD_CONF; keys without a Mallard meaning are named in one line. */
static void test_conf(const char *self) {
  char out[4096];
  run_self(self, "MALLOC_CONF=narenas:3,tcache:false,dirty_decay_ms:5000,lg_extent_max_active_fit:6", "print-conf",
           out, sizeof out);
  CHECK(strstr(out, "narenas=3 decay=5000 tcache=0"), "MALLOC_CONF not applied: %s", out);
  CHECK(strstr(out, "mallard: MALLOC_CONF: ignored (no Mallard equivalent): lg_extent_max_active_fit;"),
        "ignored-key line missing: %s", out);
  run_self(self, "MALLOC_CONF=narenas:3,dirty_decay_ms:5000 MALLARD_CONF=narenas:2", "print-conf", out, sizeof out);
  CHECK(strstr(out, "narenas=2 decay=5000") && !strstr(out, "ignored"), "MALLARD_CONF must win: %s", out);
  run_self(self, "MALLOC_CONF=narenas:x", "print-conf", out, sizeof out);
  CHECK(strstr(out, "MALLOC_CONF: bad value for option 'narenas'"), "bad MALLOC_CONF value not reported: %s", out);
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "print-conf")) {
    unsigned n = 0;
    ssize_t d = 0;
    size_t l = sizeof n;
    mallctl("opt.narenas", &n, &l, NULL, 0);
    l = sizeof d;
    mallctl("opt.dirty_decay_ms", &d, &l, NULL, 0);
    bool tc = true;
    l = sizeof tc;
    mallctl("opt.tcache", &tc, &l, NULL, 0);
    printf("narenas=%u decay=%zd tcache=%d\n", n, d, tc);
    return 0;
  }
  test_names();
  test_mib_index();
  test_growth();
  test_mallinfo_saturates();
  test_thread_counters();
  test_purge();
  test_reports();
  test_conf(argv[0]);
  return mt_result("compat");
}
