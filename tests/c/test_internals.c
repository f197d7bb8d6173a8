/* test_internals.c — unit tests of Mallard's internals: size classes, ownership map, span coalescing, option parsing. */
#include "mtest.h"
#include "core/core.h"
#include "control/control.h"
#include "prof/prof.h"
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#define KiB ((size_t)1024)
#define MiB ((size_t)1024 * 1024)

/* ---- size classes ---- */
static void test_size_classes(void) {
  for (unsigned c = 0; c < MLD_NUM_CLASSES; c++) {
    CHECK(mld_class_size[c] % 16 == 0, "class %u size %u not a multiple of 16", c, mld_class_size[c]);
    if (c) CHECK(mld_class_size[c] > mld_class_size[c - 1], "class sizes not increasing at %u", c);
  }
  CHECK(mld_class_size[0] == 16, "smallest class %u", mld_class_size[0]);
  CHECK(mld_class_size[MLD_NUM_CLASSES - 1] == MLD_MEDIUM_MAX, "largest class %u != MEDIUM_MAX",
        mld_class_size[MLD_NUM_CLASSES - 1]);
  unsigned prev = 0, bad = 0;
  for (size_t s = 0; s <= MLD_MEDIUM_MAX; s++) {
    unsigned c = mld_size_class(s);
    if (c >= MLD_NUM_CLASSES) { CHECK(0, "size %zu -> class %u out of range", s, c); if (++bad > 5) return; continue; }
    size_t cs = mld_class_size[c];
    bool ok = cs >= s && (c == 0 || mld_class_size[c - 1] < s) && c >= prev;
    /* Above 128 B a request wastes at most a quarter of its size. */
    if (s > 128) ok = ok && (cs - s) * 4 <= s;
    if (s <= MLD_SMALL_MAX) ok = ok && mld_small_class[(s + 15) >> 4] == c && (s <= 128 || c == mld_size_class_slow(s))   /* slow: sizes above 128 only */;
    if (!ok) {
      CHECK(0, "size %zu -> class %u (size %zu, previous class size %u)", s, c, cs, c ? mld_class_size[c - 1] : 0);
      if (++bad > 5) return;
    }
    prev = c;
  }
  /* The slow function agrees with the table wherever both are defined. */
  for (size_t s = 129; s <= MLD_SMALL_MAX; s++)
    if (mld_size_class_slow(s) != mld_small_class[(s + 15) >> 4]) { CHECK(0, "slow/table disagree at %zu", s); break; }
  /* The public API hands out the class size as usable size. */
  for (size_t s = 1; s <= MLD_MEDIUM_MAX; s = s * 9 / 8 + 1) {
    void *p = mallard_malloc(s);
    size_t u = mallard_usable_size(p);
    CHECK(u == mld_class_size[mld_size_class(s)], "usable_size(malloc(%zu)) = %zu, class size %u", s, u,
          mld_class_size[mld_size_class(s)]);
    mallard_free(p);
  }
}

/* ---- ownership map ---- */
static void test_ownership(void) {
  const size_t sizes[] = { 1, 5000, 100 * KiB, 1 * MiB, 3 * MiB, 20 * MiB };
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    uint8_t *p = mallard_malloc(sizes[i]);
    REQUIRE(p, "malloc");
    CHECK(mld_owned(segment_of(p)), "segment of a %zu-byte block not in the ownership map", sizes[i]);
    CHECK(mallard_owns(p) && mallard_owns(p + sizes[i] - 1), "mallard_owns(%zu-byte block)", sizes[i]);
    mallard_free(p);
  }
  /* A huge block above the cache limit is unmapped at free: its granule leaves the map. */
  uint8_t *big = mallard_malloc(mld_opt.huge_cache_max + 8 * MiB);
  REQUIRE(big, "malloc(huge_cache_max + 8M)");
  segment_t *bs = segment_of(big);
  CHECK(mld_owned(bs), "huge segment not owned");
  mallard_free(big);
  CHECK(!mld_owned(bs), "unmapped huge segment still in the ownership map");

  int local;
  static int global;
  CHECK(!mld_owned(segment_of(&local)) && !mallard_owns(&local), "stack is owned");
  CHECK(!mld_owned(segment_of(&global)) && !mallard_owns(&global), "static data is owned");
  void *sys = malloc(100);   /* the program's own malloc: glibc (or the sanitizer's) */
  CHECK(!mallard_owns(sys), "system malloc block is owned");
  free(sys);
  CHECK(!mallard_owns(NULL), "NULL is owned");
  CHECK(!mld_owned((void *)((uintptr_t)1 << MLD_ADDR_BITS)), "address beyond the map is owned");
  CHECK(!mld_owned((void *)UINTPTR_MAX), "top address is owned");

  /* Setting and clearing a bit touches that granule only, and its neighbours stay as they were. */
  uintptr_t fake = (uintptr_t)0x200000000000ull;   /* 4 MiB aligned, far from any mapping we make */
  bool before_prev = mld_owned((void *)(fake - MLD_SEGMENT_SIZE)), before_next = mld_owned((void *)(fake + MLD_SEGMENT_SIZE));
  CHECK(!mld_owned((void *)fake), "fake granule already owned");
  mld_owner_set((void *)fake, true);
  CHECK(mld_owned((void *)fake), "owner_set(true) not visible");
  CHECK(mld_owned((void *)(fake + MLD_SEGMENT_SIZE - 1)) == mld_owned(segment_of((void *)(fake + 1))),
        "granule lookup inconsistent");
  CHECK(mld_owned((void *)(fake - MLD_SEGMENT_SIZE)) == before_prev &&
        mld_owned((void *)(fake + MLD_SEGMENT_SIZE)) == before_next, "owner_set changed a neighbour");
  for (int k = 1; k < 64; k++) {   /* every bit position of a word */
    uintptr_t g = fake + (uintptr_t)k * MLD_SEGMENT_SIZE;
    mld_owner_set((void *)g, true);
    CHECK(mld_owned((void *)g), "bit %d of a word", k);
    mld_owner_set((void *)g, false);
    CHECK(!mld_owned((void *)g), "bit %d not cleared", k);
  }
  mld_owner_set((void *)fake, false);
  CHECK(!mld_owned((void *)fake), "owner_set(false) not visible");
  mld_owner_set((void *)((uintptr_t)1 << MLD_ADDR_BITS), true);   /* out of range: ignored, no crash */
}

/* ---- spans: best fit, split, coalescing with free neighbours ---- */
/* The free spans of n slots where mld_arena_alloc_span's (large) spans go back (the secure variant keeps small pages'
 * segments on lists of their own). */
#define SPANS(a, n) ((a)->spans[0][n])
static size_t free_spans(arena_t *a, size_t n) {
  size_t k = 0;
  for (page_t *pg = SPANS(a, n); pg; pg = pg->next) k++;
  return k;
}

static void test_spans(void) {
  int idx = mld_arena_create();
  REQUIRE(idx >= 0, "arena_create");
  arena_t *a = mld_arena_get((unsigned)idx);
  REQUIRE(a, "arena_get");
  bool zero;
  pthread_mutex_lock(&a->lock);   /* the spans of a fresh arena: nothing else touches them, but read under the lock */
  CHECK(a->nsegments == 0, "fresh arena has segments");
  pthread_mutex_unlock(&a->lock);

  page_t *s1 = mld_arena_alloc_span(a, 5, &zero);
  REQUIRE(s1, "alloc_span 5");
  CHECK(zero, "first span of a fresh segment is not known zero");
  page_t *s2 = mld_arena_alloc_span(a, 7, &zero);
  page_t *s3 = mld_arena_alloc_span(a, 9, &zero);
  REQUIRE(s2 && s3, "alloc_span");
  segment_t *seg = segment_of(s1);
  CHECK(a->nsegments == 1 && segment_of(s2) == seg && segment_of(s3) == seg, "three spans in one segment");
  CHECK(slot_index(s1) == MLD_FIRST_SLOT, "first span at slot %zu", slot_index(s1));
  CHECK(s2 == s1 + 5 && s3 == s2 + 7, "spans not carved consecutively");
  CHECK(s1->slot_count == 5 && s2->slot_count == 7 && s3->slot_count == 9, "slot counts");
  size_t rest = MLD_USABLE_SLOTS - 21;
  CHECK(free_spans(a, rest) == 1 && seg->free_slots == rest, "the remainder (%zu slots) is one free span", rest);
  /* Interior slots lead back to the span's first slot. */
  CHECK(page_of(seg, page_start(s3) + 8 * MLD_SLOT_SIZE + 5) == s3, "page_of interior slot");
  memset(page_start(s2), 0xEE, 7 * MLD_SLOT_SIZE);

  /* Free the middle one: no free neighbour, stays a 7-slot span. */
  mld_arena_free_span(a, s2);
  CHECK(free_spans(a, 7) == 1 && SPANS(a, 7) == s2, "freed middle span not listed as 7 slots");
  CHECK(s2->kind == PAGE_FREE && !s2->zero, "freed span must be free and dirty");
  /* Free the first: it merges with the following free span into 12 slots. */
  mld_arena_free_span(a, s1);
  CHECK(free_spans(a, 7) == 0 && free_spans(a, 5) == 0, "merged spans still listed separately");
  CHECK(free_spans(a, 12) == 1 && SPANS(a, 12) == s1, "spans 1+2 not merged into 12 slots");
  /* Best fit: a 10-slot request takes the 12-slot span (not the big remainder) and leaves 2. */
  page_t *s4 = mld_arena_alloc_span(a, 10, &zero);
  CHECK(s4 == s1, "best fit did not choose the 12-slot span");
  CHECK(!zero, "a reused dirty span must not claim to be zero");
  CHECK(free_spans(a, 2) == 1 && SPANS(a, 2) == s1 + 10, "split remainder of 2 slots missing");
  mld_arena_free_span(a, s4);
  CHECK(free_spans(a, 12) == 1 && free_spans(a, 2) == 0, "re-merge into 12 slots");
  /* Free the last used span: merges with its dirty neighbour, not with the untouched (purged) remainder: a dirty
   * span is resident memory, and `dirty` counts nothing else. */
  mld_arena_free_span(a, s3);
  CHECK(free_spans(a, 21) == 1 && SPANS(a, 21) == &seg->pages[MLD_FIRST_SLOT] && free_spans(a, rest) == 1,
        "freed spans not coalesced into 21 dirty slots beside the %zu purged ones", rest);
  CHECK(a->dirty_slots == 21 && a->purged_slots == rest, "dirty %zu, purged %zu slots", a->dirty_slots,
        a->purged_slots);
  /* Purged, the two join into the whole segment (kept mapped for what follows: retain). */
  mld_opt.retain = true;
  pthread_mutex_lock(&a->lock);
  mld_arena_purge(a, true);
  pthread_mutex_unlock(&a->lock);
  CHECK(free_spans(a, MLD_USABLE_SLOTS) == 1 && SPANS(a, MLD_USABLE_SLOTS) == &seg->pages[MLD_FIRST_SLOT],
        "all spans free and purged but not coalesced into one %d-slot span", MLD_USABLE_SLOTS);
  CHECK(free_spans(a, 21) == 0 && free_spans(a, rest) == 0, "stale entries after full coalescing");
  CHECK(seg->free_slots == MLD_USABLE_SLOTS, "segment free_slots %u", seg->free_slots);
  CHECK(a->dirty_slots == 0 && a->purged_slots == MLD_USABLE_SLOTS, "dirty %zu, purged %zu slots", a->dirty_slots,
        a->purged_slots);

  /* Large-block resizing in place: grow into the following free span, shrink gives the tail back. */
  page_t *l = mld_arena_alloc_span(a, 4, &zero);
  REQUIRE(l, "alloc_span 4");
  l->user = page_start(l);
  page_t *wall = mld_arena_alloc_span(a, 3, &zero);   /* right after l */
  CHECK(wall == l + 4, "wall span not adjacent");
  CHECK(!mld_arena_grow_large(a, l, 6), "grow into a used neighbour succeeded");
  mld_arena_free_span(a, wall);
  CHECK(mld_arena_grow_large(a, l, 6), "grow into a free 3+ slot neighbour failed");
  CHECK(l->slot_count == 6 && l->user == page_start(l) && (l + 5)->offset == 5, "grown span bookkeeping");
  CHECK(free_spans(a, 1) == 1 && free_spans(a, MLD_USABLE_SLOTS - 7) == 1,
        "after growth: not the wall's dirty last slot and the purged rest");
  mld_arena_shrink_large(a, l, 2);
  CHECK(l->slot_count == 2 && free_spans(a, 5) == 1 && free_spans(a, 1) == 0,
        "shrink did not return the tail coalesced with the dirty slot");
  mld_arena_free_span(a, l);
  CHECK(free_spans(a, 7) == 1 && free_spans(a, MLD_USABLE_SLOTS - 7) == 1, "not 7 dirty slots and the purged rest");
  pthread_mutex_lock(&a->lock);
  mld_arena_purge(a, true);
  pthread_mutex_unlock(&a->lock);
  mld_opt.retain = false;
  CHECK(free_spans(a, MLD_USABLE_SLOTS) == 1 && a->nsegments == 1, "not whole again after shrink, free and purge");

  /* Only a page's first descriptor may name a heap: free() compares the block's slot's own descriptor with the
   * thread's heap (api.c dealloc). A span made of slots whose descriptors named one has the others cleared. */
  static heap_t stale;
  page_t *m = mld_arena_alloc_span(a, 8, &zero);
  REQUIRE(m, "alloc_span 8");
  for (int i = 0; i < 8; i++) atomic_store_explicit(&m[i].heap, &stale, memory_order_relaxed);
  mld_arena_free_span(a, m);
  page_t *m2 = mld_arena_alloc_span(a, 8, &zero);
  REQUIRE(m2 == m, "the same 8 slots again");
  for (int i = 1; i < 8; i++)
    CHECK(atomic_load_explicit(&m2[i].heap, memory_order_relaxed) == NULL, "slot %d of a new span names a heap", i);
  mld_arena_free_span(a, m2);

  /* Purging everything: the segment is unmapped (retain:false) and leaves the ownership map. */
  pthread_mutex_lock(&a->lock);
  size_t bytes = mld_arena_purge(a, true);
  size_t nseg = a->nsegments;
  pthread_mutex_unlock(&a->lock);
  CHECK(bytes > 0, "purge found nothing dirty");
  if (!mld_opt.retain) {
    CHECK(nseg == 0, "empty segment not released after purge (%zu)", nseg);
    CHECK(!mld_owned(seg), "released segment still owned");
  }
}

/* ---- options ---- */
/* Field-by-field comparison: the string buffer may hold stale bytes after its terminator. */
static bool opts_equal(const options_t *a, const options_t *b) {
  return a->narenas == b->narenas && a->dirty_decay_ms == b->dirty_decay_ms &&
         a->background_thread == b->background_thread && a->retain == b->retain && a->thp == b->thp &&
         a->verbose == b->verbose && a->abort_conf == b->abort_conf && a->stats_print == b->stats_print &&
         !strcmp(a->stats_print_opts, b->stats_print_opts) && a->huge_cache_max == b->huge_cache_max &&
         a->page_cache == b->page_cache && !memcmp(a->page_slots, b->page_slots, sizeof a->page_slots);
}

static char errbuf[8192];
/* Run mld_options_init() with MALLARD_CONF = conf (NULL: unset), capturing what it writes on stderr. */
static void options_with(const char *conf) {
  if (conf) setenv("MALLARD_CONF", conf, 1); else unsetenv("MALLARD_CONF");
  fflush(stderr);
  char path[] = "/tmp/mallard-ctest-errXXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0, "mkstemp");
  int saved = dup(2);
  dup2(fd, 2);
  mld_options_init();
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  ssize_t n = pread(fd, errbuf, sizeof errbuf - 1, 0);
  errbuf[n > 0 ? n : 0] = 0;
  close(fd);
  unlink(path);
}

static void test_options(void) {
  options_t saved;
  memcpy(&saved, &mld_opt, sizeof saved);
  setenv("MALLARD_CONF_PATH", "/nonexistent/mallard.conf", 1);

  options_with(NULL);
  CHECK(errbuf[0] == 0, "defaults printed something: %s", errbuf);
  CHECK(mld_opt.narenas == 0 && mld_opt.dirty_decay_ms == 1000 && mld_opt.background_thread && !mld_opt.retain &&
        mld_opt.thp == 0 && mld_opt.page_cache == 4 && mld_opt.huge_cache_max == 256 * MiB, "defaults");
  options_t defaults;
  memcpy(&defaults, &mld_opt, sizeof defaults);

  options_with(" narenas:3, dirty_decay_ms:250 ,background_thread:false,retain:true,thp:never,page_cache:9,"
               "huge_cache_max:3M,stats_print:1,stats_print_opts:Jb,verbose:0,slab_sizes:1-1024:2|8K-64K:16");
  CHECK(errbuf[0] == 0, "valid options printed: %s", errbuf);
  CHECK(mld_opt.narenas == 3, "narenas %u", mld_opt.narenas);
  CHECK(mld_opt.dirty_decay_ms == 250, "dirty_decay_ms %ld", mld_opt.dirty_decay_ms);
  CHECK(!mld_opt.background_thread && mld_opt.retain && mld_opt.stats_print && !mld_opt.verbose, "booleans");
  CHECK(mld_opt.thp == -1, "thp %d", mld_opt.thp);
  CHECK(mld_opt.page_cache == 9, "page_cache %u", mld_opt.page_cache);
  CHECK(mld_opt.huge_cache_max == 3 * MiB, "huge_cache_max %zu", mld_opt.huge_cache_max);
  CHECK(!strcmp(mld_opt.stats_print_opts, "Jb"), "stats_print_opts '%s'", mld_opt.stats_print_opts);
  for (unsigned c = 0; c < MLD_NUM_CLASSES; c++) {
    unsigned want = mld_class_size[c] <= 1024 ? 2 : (mld_class_size[c] >= 8192 && mld_class_size[c] <= 65536) ? 16
                                                                                                  : defaults.page_slots[c];
    CHECK(mld_opt.page_slots[c] == want, "slab_sizes: class %u (%u B) has %u slots, want %u", c, mld_class_size[c],
          mld_opt.page_slots[c], want);
  }
  /* Suffixes and limits. */
  options_with("huge_cache_max:2G,dirty_decay_ms:-1,thp:always,narenas:64,page_cache:0");
  CHECK(errbuf[0] == 0, "valid limits printed: %s", errbuf);
  CHECK(mld_opt.huge_cache_max == ((size_t)2 << 30) && mld_opt.dirty_decay_ms == -1 && mld_opt.thp == 2 &&
        mld_opt.narenas == 64 && mld_opt.page_cache == 0, "limits accepted");
  options_with("huge_cache_max:512k,thp:madvise,dirty_decay_ms:0");
  CHECK(mld_opt.huge_cache_max == 512 * KiB && mld_opt.thp == 1 && mld_opt.dirty_decay_ms == 0, "k suffix, madvise");

  /* Bad values: one line each naming the source, key and value; the default stays. */
  struct { const char *conf, *expect; } bad[] = {
    { "narenas:x", "MALLARD_CONF: bad value for option 'narenas' (value 'x')" },
    { "narenas:65", "'narenas' (value '65')" },
    { "narenas:-1", "'narenas' (value '-1')" },
    { "narenas:", "'narenas' (value '')" },
    { "dirty_decay_ms:-2", "'dirty_decay_ms' (value '-2')" },
    { "dirty_decay_ms:99999999999999999999999", "'dirty_decay_ms'" },
    { "background_thread:yes", "'background_thread' (value 'yes')" },
    { "thp:sometimes", "'thp' (value 'sometimes')" },
    { "huge_cache_max:2T", "'huge_cache_max' (value '2T')" },
    { "huge_cache_max:-5M", "'huge_cache_max'" },
    { "page_cache:65", "'page_cache' (value '65')" },
    { "stats_print_opts:Jx", "'stats_print_opts' (value 'Jx')" },
    { "slab_sizes:100K-200K:1", "'slab_sizes'" },          /* a 64 KiB page cannot hold a 100 KiB block */
    { "slab_sizes:1-1024:17", "'slab_sizes'" },
    { "slab_sizes:2048-1024:2", "'slab_sizes'" },
    { "slab_sizes:1-1024", "'slab_sizes'" },
    { "nosuchoption:1", "unknown option 'nosuchoption'" },
    { "narenas", "missing ':value'" },
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    options_with(bad[i].conf);
    CHECK(strstr(errbuf, bad[i].expect) != NULL, "conf '%s': stderr '%s' lacks '%s'", bad[i].conf, errbuf, bad[i].expect);
    CHECK(strstr(errbuf, "the default stays in force") != NULL, "conf '%s': no 'default stays' note", bad[i].conf);
    size_t lines = 0;
    for (const char *p = errbuf; *p; p++) lines += *p == '\n';
    CHECK(lines == 1, "conf '%s': %zu lines on stderr, want 1", bad[i].conf, lines);
    CHECK(opts_equal(&mld_opt, &defaults), "conf '%s' changed the options", bad[i].conf);
  }
  /* A bad item does not spoil the good ones around it; a bad slab_sizes range changes no class at all. */
  options_with("narenas:2,narenas:zz,page_cache:5,slab_sizes:1-1024:2|100K-200K:1");
  CHECK(mld_opt.narenas == 2 && mld_opt.page_cache == 5, "good items around bad ones lost");
  CHECK(!memcmp(mld_opt.page_slots, defaults.page_slots, sizeof defaults.page_slots), "partial slab_sizes applied");

  /* The configuration file (MALLARD_CONF_PATH): comments, new lines; the environment wins key by key. */
  char path[] = "/tmp/mallard-ctest-confXXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0, "mkstemp");
  const char *file = "# a comment line\nnarenas:5\n  dirty_decay_ms:4000  \n# page_cache:1\npage_cache:7\n";
  REQUIRE(write(fd, file, strlen(file)) == (ssize_t)strlen(file), "write");
  close(fd);
  setenv("MALLARD_CONF_PATH", path, 1);
  options_with(NULL);
  CHECK(errbuf[0] == 0, "conf file printed: %s", errbuf);
  CHECK(mld_opt.narenas == 5 && mld_opt.dirty_decay_ms == 4000 && mld_opt.page_cache == 7, "conf file not applied");
  options_with("page_cache:2");
  CHECK(mld_opt.narenas == 5 && mld_opt.page_cache == 2, "MALLARD_CONF must override the file key by key");
  unlink(path);
  /* A symbolic link's target name is the setting, as with jemalloc's /etc/malloc.conf. */
  char link[] = "/tmp/mallard-ctest-linkXXXXXX";
  fd = mkstemp(link);
  REQUIRE(fd >= 0, "mkstemp");
  close(fd);
  unlink(link);
  REQUIRE(symlink("narenas:6,retain:true", link) == 0, "symlink");
  setenv("MALLARD_CONF_PATH", link, 1);
  options_with(NULL);
  CHECK(mld_opt.narenas == 6 && mld_opt.retain, "symlink conf not applied (narenas %u)", mld_opt.narenas);
  unlink(link);
  setenv("MALLARD_CONF_PATH", "/nonexistent/mallard.conf", 1);

  /* abort_conf:true turns a bad item into an abort (checked in a child). */
  pid_t pid = fork();
  REQUIRE(pid >= 0, "fork");
  if (pid == 0) {
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 2);
    setenv("MALLARD_CONF", "abort_conf:true,narenas:bad", 1);
    signal(SIGABRT, SIG_DFL);
    mld_options_init();
    _exit(0);
  }
  int st;
  waitpid(pid, &st, 0);
  CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "abort_conf:true with a bad value did not abort (status %#x)", st);

  memcpy(&mld_opt, &saved, sizeof saved);
  unsetenv("MALLARD_CONF");
  unsetenv("MALLARD_CONF_PATH");
}

/* prof_signal's names: glibc's sigabbrev_np, or (musl) Mallard's own table, which must give the same names; the
 * C library's reserved signals (glibc 32-33, musl 32-34: below SIGRTMIN) and faults refused. */
static void test_signal_names(void) {
  static const struct { const char *name; int sig; } known[] = {
    { "HUP", SIGHUP }, { "SIGUSR2", SIGUSR2 }, { "USR1", SIGUSR1 }, { "SIGPOLL", 29 }, { "PWR", 30 },
    { "STKFLT", 16 }, { "WINCH", SIGWINCH }, { "SIGTERM", SIGTERM }, { "none", 0 }, { "12", 12 } };
  for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
    CHECK(mld_prof_signal_parse(known[i].name, strlen(known[i].name)) == known[i].sig, "prof_signal:%s != %d",
          known[i].name, known[i].sig);
  static const char *const refused[] = { "SIGKILL", "SEGV", "SYS", "ABRT", "IO", "IOT", "USR3", "32" };
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
    CHECK(mld_prof_signal_parse(refused[i], strlen(refused[i])) == -1, "prof_signal:%s accepted", refused[i]);
  for (int sig = 32; sig < SIGRTMIN; sig++) {
    char n[8];
    snprintf(n, sizeof n, "%d", sig);
    CHECK(mld_prof_signal_parse(n, strlen(n)) == -1, "prof_signal:%d (the C library's own) accepted", sig);
  }
  char rt[8];
  snprintf(rt, sizeof rt, "%d", SIGRTMIN);
  CHECK(mld_prof_signal_parse(rt, strlen(rt)) == SIGRTMIN, "prof_signal:%d (SIGRTMIN) refused", SIGRTMIN);
  static const struct { int sig; const char *name; } names[] = {
    { SIGUSR2, "SIGUSR2" }, { 29, "SIGPOLL" }, { SIGHUP, "SIGHUP" }, { 31, "SIGSYS" }, { 0, "none" }, { 40, "40" } };
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    char out[16];
    mld_prof_signal_name(names[i].sig, out, sizeof out);
    CHECK(!strcmp(out, names[i].name), "signal %d is named %s, want %s", names[i].sig, out, names[i].name);
  }
}

/* ---- carving: a page's first chunk is MLD_EXTEND_FIRST, the next ones MLD_EXTEND_BYTES, at least 4 blocks ---- */
static void test_carve(void) {
#ifndef MALLARD_SECURE
  static heap_t owner;   /* names the pages' owner; nothing allocates from it */
  arena_t *a = mld_arena_get(0);
  REQUIRE(a, "arena 0");
  const size_t sizes[] = { 16, 64, 1024, 2048, 8192 };
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    unsigned c = mld_size_class(sizes[i]);
    size_t bs = mld_class_size[c];
    bool zero;
    page_t *pg = mld_arena_alloc_span_kind(a, 1, PAGE_SMALL, &zero);
    REQUIRE(pg, "a one-slot span");
    mld_page_init(pg, c, &owner);
    size_t first = MLD_EXTEND_FIRST / bs < 4 ? 4 : MLD_EXTEND_FIRST / bs;
    size_t next = MLD_EXTEND_BYTES / bs < 4 ? 4 : MLD_EXTEND_BYTES / bs;
    if (first > pg->reserved) first = pg->reserved;
    CHECK(mld_page_extend(pg) && pg->capacity == first, "%zu B blocks: %u carved first, %zu expected (%zu bytes)", bs,
          pg->capacity, first, (size_t)MLD_EXTEND_FIRST);
    if (next > pg->reserved - first) next = pg->reserved - first;
    CHECK(mld_page_extend(pg) && pg->capacity == first + next, "%zu B blocks: %u carved after the second chunk, %zu "
          "expected", bs, pg->capacity, first + next);
    pg->capacity = 0;   /* nothing handed out: the span goes back as it came */
    mld_arena_free_span(a, pg);
  }
#endif
}

/* ---- remote frees: one batch per page in the freeing thread's outbox, sent at MLD_OUTBOX_BLOCKS blocks, at
 * MLD_OUTBOX_BYTES bytes and every MLD_OUTBOX_AGE remote frees (the common case inlined into free: core.h
 * mld_free_remote_fast; the rest: outbox.c). A thread frees blocks the main thread allocated and, after each free,
 * reads its own outbox and counters. ---- */
#ifndef MALLARD_SECURE
enum { OB_SMALL = 200, OB_KIB = 24, OB_MEDIUM = 16 };
static void *ob_small[OB_SMALL], *ob_kib[OB_KIB], *ob_medium[OB_MEDIUM];
static size_t ob_nmedium;   /* medium blocks allocated: the last one lies past its page's first slot */

static page_t *ob_page(void *p) { return page_of(segment_of(p), p); }
/* Blocks of `v` in the page of v[0], at most `want`, moved to the front; how many. */
static size_t ob_same_page(void **v, size_t n, size_t want) {
  size_t k = 0;
  for (size_t i = 0; i < n && k < want; i++)
    if (ob_page(v[i]) == ob_page(v[0])) { void *t = v[k]; v[k++] = v[i]; v[i] = t; }
  return k;
}
static uint32_t ob_pending(page_t *pg) {   /* blocks of pg waiting in this thread's outbox */
  outbox_t *e = mld_outbox_slot(mld_tls_heap, pg);
  return e->page == pg ? e->count : 0;
}
/* Free v[0..n) (blocks of one page, allocated by another thread) one by one: after free k (from 1), `sent_at` (0:
 * never) decides whether the batch went out, every free is counted once in the thread's counters. */
static void ob_free_run(const char *what, void **v, size_t n, size_t sent_at) {
  page_t *pg = ob_page(v[0]);
  for (size_t k = 1; k <= n; k++) {
    heap_t *h = mld_tls_heap;
    uint64_t remote = h->stats.remote_frees, nfree = h->stats.cls[pg->size_class].nfree;
    mallard_free(v[k - 1]);
    v[k - 1] = NULL;   /* the main thread frees what is left */
    size_t want = sent_at && k >= sent_at ? k - sent_at : k;
    CHECK(ob_pending(pg) == want, "%s: %zu blocks pending after free %zu, %zu expected", what, (size_t)ob_pending(pg),
          k, want);
    CHECK(h->stats.remote_frees == remote + 1 && h->stats.cls[pg->size_class].nfree == nfree + 1,
          "%s: free %zu counted %llu remote frees and %llu frees of its class, 1 expected", what, k,
          (unsigned long long)(h->stats.remote_frees - remote),
          (unsigned long long)(h->stats.cls[pg->size_class].nfree - nfree));
  }
}
static void *ob_freer(void *arg) {
  (void)arg;
  /* Count: 64-byte blocks go out at the 64th free of their page's batch. */
  size_t n = ob_same_page(ob_small, OB_SMALL, MLD_OUTBOX_BLOCKS + 8);
  REQUIRE(n == MLD_OUTBOX_BLOCKS + 8, "%zu blocks of 64 bytes in one page", n);
  mallard_free(ob_small[n - 1]);   /* this thread's first free: it gets a heap */
  ob_small[n - 1] = NULL;
  mt_flush_outbox();
  page_t *pg = ob_page(ob_small[0]);
  ob_free_run("64 B", ob_small, MLD_OUTBOX_BLOCKS + 4, MLD_OUTBOX_BLOCKS);
  mt_flush_outbox();
  CHECK(ob_pending(pg) == 0, "a flush left blocks pending");
  /* Bytes: 1 KiB blocks go out at the batch's 8 KiB. */
  n = ob_same_page(ob_kib, OB_KIB, MLD_OUTBOX_BYTES / 1024 + 2);
  REQUIRE(n == MLD_OUTBOX_BYTES / 1024 + 2, "%zu blocks of 1 KiB in one page", n);
  ob_free_run("1 KiB", ob_kib, n, MLD_OUTBOX_BYTES / 1024);
  mt_flush_outbox();
  /* Age: the MLD_OUTBOX_AGE-th remote free since the last flush sends every batch. */
  heap_t *h = mld_tls_heap;
  h->outbox_ops = MLD_OUTBOX_AGE - 3;
  ob_free_run("age", ob_small + MLD_OUTBOX_BLOCKS + 4, 3, 3);
  /* A block past its medium page's first slot goes to its page, not to its slot's descriptor (8 KiB and more: sent at
   * once). The page is the main thread's current one, which no sweep collects from: its published count is exact. */
  void *far = ob_medium[ob_nmedium - 1];
  pg = ob_page(far);
  page_t *slot = slot_page(segment_of(far), far);
  uintptr_t slot_tf = atomic_load(&slot->thread_free);
  size_t before = atomic_load(&pg->thread_free) >> MLD_BATCH_COUNT_SHIFT;
  mallard_free(far);
  size_t after = atomic_load(&pg->thread_free) >> MLD_BATCH_COUNT_SHIFT;
  CHECK(after == before + 1 && atomic_load(&slot->thread_free) == slot_tf, "a medium block past its page's first slot: "
        "%zu blocks published to its page, 1 expected", after - before);
  ob_medium[ob_nmedium - 1] = NULL;
  mt_flush_outbox();
  return NULL;
}
static void test_outbox(void) {
  for (size_t i = 0; i < OB_SMALL; i++) REQUIRE(ob_small[i] = mallard_malloc(64), "malloc(64)");
  for (size_t i = 0; i < OB_KIB; i++) REQUIRE(ob_kib[i] = mallard_malloc(1024), "malloc(1024)");
  do {
    REQUIRE(ob_nmedium < OB_MEDIUM, "no medium block past its page's first slot");
    void *p = ob_medium[ob_nmedium++] = mallard_malloc(100000);
    REQUIRE(p, "malloc(100000)");
    if (slot_page(segment_of(p), p) != ob_page(p)) break;
  } while (1);
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, ob_freer, NULL) == 0, "pthread_create");
  pthread_join(t, NULL);
  for (size_t i = 0; i < OB_SMALL; i++) mallard_free(ob_small[i]);   /* what the thread left (NULL: freed there) */
  for (size_t i = 0; i < OB_KIB; i++) mallard_free(ob_kib[i]);
  for (size_t i = 0; i < OB_MEDIUM; i++) mallard_free(ob_medium[i]);
}
#endif

int main(void) {
  void *p = mallard_malloc(1);   /* initialises the allocator: classes, options, arenas */
  mallard_free(p);
  test_size_classes();
  test_ownership();
  test_spans();
  test_carve();
#ifndef MALLARD_SECURE
  test_outbox();
#endif
  test_options();
  test_signal_names();
  /* The allocator still works with the restored options. */
  p = mallard_malloc(12345);
  CHECK(p && mallard_owns(p), "malloc after the unit tests");
  mallard_free(p);
  return mt_result("test_internals");
}
