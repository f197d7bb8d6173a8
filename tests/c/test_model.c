/* test_model.c — randomised model-based test: random malloc/calloc/realloc/aligned/free on several threads, checked
 * against a shadow record (no overlap, contents kept, alignment, usable size), with impossible sizes near SIZE_MAX,
 * huge reallocs that move, aligned huge blocks and blocks freed/reallocated by other threads; meanwhile side threads
 * call mallard_collect / malloc_trim, fork, run threads on user-supplied stacks and allocate in every round of TLS
 * destructors. Seed (the workers' operations): argv[1] or MALLARD_TEST_SEED. */
#include "mtest.h"
#include <inttypes.h>
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/wait.h>

/* Under the sanitizers some side threads cannot run: fork from a multi-threaded process is supported neither by
 * ThreadSanitizer nor by ASan's allocator (see CMakeLists.txt), and ThreadSanitizer itself crashes when a TLS
 * destructor allocates after its own per-thread teardown (reproduced with glibc's malloc alone). The normal build
 * runs them all, in the three link modes. */
#if defined(__SANITIZE_THREAD__)
#define MT_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define MT_TSAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define MT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MT_ASAN 1
#endif
#endif
#if defined(MT_TSAN) || defined(MT_ASAN)
#define MT_NO_FORK 1
#endif

#define NTHREADS 4
#define OPS_PER_THREAD 30000
#define MAX_LIVE 1500                          /* blocks per thread */
#define MAX_LIVE_BYTES ((size_t)160 << 20)     /* per thread: bounds the test's memory */
#define POOL 256                               /* blocks handed from one thread to another */

typedef struct { uint8_t *p; size_t size, align, usable; uint64_t tag; } blk_t;

/* ---- shadow: every live block's [start, start + usable) in a sorted array; no two may overlap ---- */
static pthread_mutex_t shadow_lock = PTHREAD_MUTEX_INITIALIZER;
static struct { uintptr_t lo, hi; } shadow[NTHREADS * MAX_LIVE + POOL + 16];
static size_t nshadow;

static size_t shadow_find(uintptr_t lo) {   /* first index with .lo >= lo */
  size_t a = 0, b = nshadow;
  while (a < b) { size_t m = (a + b) / 2; if (shadow[m].lo < lo) a = m + 1; else b = m; }
  return a;
}
static void shadow_add(const blk_t *k) {
  uintptr_t lo = (uintptr_t)k->p, hi = lo + (k->usable ? k->usable : 1);
  pthread_mutex_lock(&shadow_lock);
  size_t i = shadow_find(lo);
  if (i > 0) CHECK(shadow[i - 1].hi <= lo, "block %p+%zu overlaps live block %#" PRIxPTR "-%#" PRIxPTR, (void *)k->p,
                   k->usable, shadow[i - 1].lo, shadow[i - 1].hi);
  if (i < nshadow) CHECK(hi <= shadow[i].lo, "block %p+%zu overlaps live block %#" PRIxPTR "-%#" PRIxPTR, (void *)k->p,
                         k->usable, shadow[i].lo, shadow[i].hi);
  memmove(&shadow[i + 1], &shadow[i], (nshadow - i) * sizeof shadow[0]);
  shadow[i].lo = lo;
  shadow[i].hi = hi;
  nshadow++;
  pthread_mutex_unlock(&shadow_lock);
}
static void shadow_remove(const blk_t *k) {
  pthread_mutex_lock(&shadow_lock);
  size_t i = shadow_find((uintptr_t)k->p);
  bool found = i < nshadow && shadow[i].lo == (uintptr_t)k->p;
  CHECK(found, "block %p missing from the shadow", (void *)k->p);
  if (found) {
    memmove(&shadow[i], &shadow[i + 1], (nshadow - i - 1) * sizeof shadow[0]);
    nshadow--;
  }
  pthread_mutex_unlock(&shadow_lock);
}

/* ---- contents: every byte of blocks up to 16 KiB; for bigger ones the first and last 4 KiB and one byte every
 * STRIDE (a stride that is not a multiple of the page size walks through every offset within pages) ---- */
#define DENSE 16384
#define STRIDE 16411
static void fill(uint8_t *p, size_t n, uint64_t tag) {
  if (n <= DENSE) { mt_fill(p, n, tag); return; }
  for (size_t i = 0; i < 4096; i++) p[i] = mt_pat(tag, i);
  for (size_t i = n - 4096; i < n; i++) p[i] = mt_pat(tag, i);
  for (size_t i = 4096; i < n - 4096; i += STRIDE) p[i] = mt_pat(tag, i);
}
/* Check the positions fill(n) wrote that lie below `upto`; returns the first bad offset or SIZE_MAX. */
static size_t verify(const uint8_t *p, size_t n, uint64_t tag, size_t upto) {
  if (n <= DENSE) {
    size_t m = n < upto ? n : upto, i = mt_verify(p, m, tag);
    return i == m ? SIZE_MAX : i;
  }
  for (size_t i = 0; i < 4096 && i < upto; i++) if (p[i] != mt_pat(tag, i)) return i;
  for (size_t i = n - 4096; i < n && i < upto; i++) if (p[i] != mt_pat(tag, i)) return i;
  for (size_t i = 4096; i < n - 4096 && i < upto; i += STRIDE) if (p[i] != mt_pat(tag, i)) return i;
  return SIZE_MAX;
}
static bool is_zero(const uint8_t *p, size_t n) {
  if (n <= DENSE) { for (size_t i = 0; i < n; i++) if (p[i]) return false; return true; }
  size_t stride = n <= (1u << 20) ? 61 : 16411;   /* sampled, strides prime to page sizes */
  for (size_t i = 0; i < n; i += stride) if (p[i]) return false;
  return p[n - 1] == 0;
}

/* ---- the hand-over pool: blocks freed or reallocated by a thread other than their allocator ---- */
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static blk_t pool[POOL];
static size_t npool;

static uint64_t seed;
static _Atomic(uint64_t) nops[16];
enum { OP_MALLOC, OP_CALLOC, OP_ALIGNED, OP_REALLOC, OP_FREE, OP_HANDOFF, OP_ADOPT, OP_FAILED, OP_HUGE_MOVE,
       OP_HUGE_ALIGNED, OP_COLLECT, OP_FORK, OP_STACK_THREAD, OP_TLS_ROUND };

/* Requests no allocator can serve: each must fail with ENOMEM and leave everything else as it was. */
static const size_t impossible[] = { SIZE_MAX, SIZE_MAX - 1, SIZE_MAX - 15, SIZE_MAX - 4095, SIZE_MAX - 4096,
                                     SIZE_MAX - 16384, SIZE_MAX - (4u << 20), SIZE_MAX / 2 + 1, (size_t)PTRDIFF_MAX,
                                     (size_t)1 << 62 };
static __thread volatile size_t vsize;   /* per thread: the workers call V() at once */
static size_t V(size_t x) { vsize = x; return vsize; }

static size_t pick_size(mt_rng_t *r) {
  uint64_t x = mt_rng_below(r, 10000);
  if (x < 7000) return mt_rng_below(r, 513);                              /* mostly small (0 included) */
  if (x < 9000) return 512 + mt_rng_below(r, 32 * 1024);
  if (x < 9850) return 32 * 1024 + mt_rng_below(r, 2 * 1024 * 1024);      /* medium and large */
  if (x < 9990) return 2 * 1024 * 1024 + mt_rng_below(r, 6 * 1024 * 1024); /* huge */
  return 8 * 1024 * 1024 + mt_rng_below(r, 56 * 1024 * 1024);              /* a few up to 64 MiB */
}

static void check_new(blk_t *k, const char *what) {
  CHECK(((uintptr_t)k->p & ((k->align < 16 ? 16 : k->align) - 1)) == 0, "%s(%zu, align %zu) = %p misaligned", what,
        k->size, k->align, (void *)k->p);
  k->usable = M_usable(k->p);
  CHECK(k->usable >= k->size, "%s(%zu): usable %zu", what, k->size, k->usable);
}

static void release(blk_t *k) {
  size_t bad = verify(k->p, k->size, k->tag, SIZE_MAX);
  CHECK(bad == SIZE_MAX, "block %p (size %zu, tag %" PRIx64 ") byte %zu changed while live", (void *)k->p, k->size,
        k->tag, bad);
  shadow_remove(k);
  M_free(k->p);
}

/* MALLARD_TEST_QEMU set (scripts/test-aarch64.sh): no fork while any thread starts or ends. qemu-user holds a lock
 * of its own while a thread starts or ends, and a fork then leaves it held in the child for ever (the child's thread
 * creation hangs, whatever the malloc): docs/PLATFORMS.md. Three rules: side threads create and join their threads
 * under spawn_lock; main creates every thread under it and releases it only once each has run (a new thread takes
 * qemu's lock once more after its creator's pthread_create returned); and no thread of main's returns before the
 * forker has made its last fork (mt_leave; the forker's 40 forks do not wait for the other threads to end). */
static bool spawn_serialized;
static pthread_mutex_t spawn_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(unsigned) threads_running;   /* main's threads that have started */
static _Atomic(int) forks_done;             /* the forker made its last fork */
static void spawn_begin(void) { if (spawn_serialized) pthread_mutex_lock(&spawn_lock); }
static void spawn_end(void) { if (spawn_serialized) pthread_mutex_unlock(&spawn_lock); }
static void mt_started(void) { atomic_fetch_add(&threads_running, 1); }
static void mt_leave(void) {
  if (!spawn_serialized) return;
  while (!atomic_load(&forks_done)) usleep(1000);
}

static void *thread_main(void *arg) {
  mt_started();
  unsigned id = (unsigned)(uintptr_t)arg;
  mt_rng_t r;
  mt_rng_seed(&r, seed * 1000003u + id);
  static __thread blk_t live[MAX_LIVE];
  size_t nlive = 0, bytes = 0;
  uint64_t next_tag = (uint64_t)id << 48;
  for (unsigned op = 0; op < OPS_PER_THREAD; op++) {
    uint64_t x = mt_rng_below(&r, 100);
    bool full = nlive == MAX_LIVE || bytes > MAX_LIVE_BYTES;
    if (nlive && (full || x < 25)) {                 /* free a random live block */
      size_t i = mt_rng_below(&r, nlive);
      bytes -= live[i].size;
      release(&live[i]);
      live[i] = live[--nlive];
      atomic_fetch_add(&nops[OP_FREE], 1);
    } else if (nlive && x < 40) {                    /* realloc a random live block */
      size_t i = mt_rng_below(&r, nlive);
      blk_t *k = &live[i];
      size_t n = mt_rng_below(&r, 4) ? pick_size(&r) : k->size + mt_rng_below(&r, 64);
      size_t bad = verify(k->p, k->size, k->tag, SIZE_MAX);
      CHECK(bad == SIZE_MAX, "before realloc: block %p byte %zu changed", (void *)k->p, bad);
      shadow_remove(k);
      uint8_t *q = M_realloc(k->p, n);
      if (!q && n == 0) {                            /* realloc(p, 0) freed it (glibc behaviour) */
        bytes -= k->size;
        live[i] = live[--nlive];
        atomic_fetch_add(&nops[OP_REALLOC], 1);
        continue;
      }
      REQUIRE(q, "seed %" PRIu64 ": realloc(%p, %zu) failed", seed, (void *)k->p, n);
      blk_t nk = { q, n, 16, 0, next_tag++ };
      check_new(&nk, "realloc");
      size_t keep = k->size < n ? k->size : n;
      bad = verify(q, k->size, k->tag, keep);
      CHECK(bad == SIZE_MAX, "realloc %zu -> %zu (%p -> %p): byte %zu lost", k->size, n, (void *)k->p, (void *)q, bad);
      fill(q, n, nk.tag);
      shadow_add(&nk);
      bytes = bytes - k->size + n;
      *k = nk;
      atomic_fetch_add(&nops[OP_REALLOC], 1);
    } else if (x < 45) {                             /* hand a block to another thread, or take one */
      pthread_mutex_lock(&pool_lock);
      if (nlive && npool < POOL && mt_rng_below(&r, 2)) {
        size_t i = mt_rng_below(&r, nlive);
        bytes -= live[i].size;
        pool[npool++] = live[i];
        live[i] = live[--nlive];
        atomic_fetch_add(&nops[OP_HANDOFF], 1);
      } else if (npool && nlive < MAX_LIVE) {
        size_t j = mt_rng_below(&r, npool);
        live[nlive] = pool[j];
        bytes += live[nlive].size;
        nlive++;
        pool[j] = pool[--npool];
        atomic_fetch_add(&nops[OP_ADOPT], 1);
      }
      pthread_mutex_unlock(&pool_lock);
    } else if (x < 47) {                             /* an impossible size: NULL + ENOMEM, nothing touched */
      size_t n = V(impossible[mt_rng_below(&r, sizeof impossible / sizeof impossible[0])]);
      uint64_t how = mt_rng_below(&r, 5);
      errno = 0;
      if (how == 0) {
        void *p = M_malloc(n);
        CHECK(!p && errno == ENOMEM, "seed %" PRIu64 ": malloc(%zu) = %p errno %d", seed, n, p, errno);
      } else if (how == 1) {
        void *p = M_calloc(1 + mt_rng_below(&r, 3), n);
        CHECK(!p && errno == ENOMEM, "seed %" PRIu64 ": calloc(k, %zu) = %p errno %d", seed, n, p, errno);
      } else if (how == 2) {
        void *p = M_aligned_alloc((size_t)1 << (4 + mt_rng_below(&r, 20)), n);
        CHECK(!p && errno == ENOMEM, "seed %" PRIu64 ": aligned_alloc(.., %zu) = %p errno %d", seed, n, p, errno);
      } else if (nlive) {                            /* realloc of a live block: fails, the block stays intact */
        blk_t *k = &live[mt_rng_below(&r, nlive)];
        void *q = M_realloc(k->p, n);
        CHECK(!q && errno == ENOMEM, "seed %" PRIu64 ": realloc(%p [%zu], %zu) = %p errno %d", seed, (void *)k->p,
              k->size, n, q, errno);
        size_t bad = verify(k->p, k->size, k->tag, SIZE_MAX);
        CHECK(bad == SIZE_MAX, "seed %" PRIu64 ": failed realloc(%p [%zu], %zu) changed byte %zu", seed, (void *)k->p,
              k->size, n, bad);
        CHECK(M_usable(k->p) == k->usable, "seed %" PRIu64 ": failed realloc changed the usable size %zu -> %zu", seed,
              k->usable, M_usable(k->p));
      }
      atomic_fetch_add(&nops[OP_FAILED], 1);
    } else if (x < 49 && nlive && bytes < MAX_LIVE_BYTES / 2) {   /* a huge block grown (moves) or shrunk a lot */
      size_t i = mt_rng_below(&r, nlive);
      blk_t *k = &live[i];
      size_t n = k->size < (2u << 20) ? (2u << 20) + mt_rng_below(&r, 6u << 20)
               : mt_rng_below(&r, 2) ? k->size * 2 + mt_rng_below(&r, 1u << 20) : k->size / 3;
      if (n > (64u << 20)) n = 64u << 20;
      shadow_remove(k);
      uint8_t *q = M_realloc(k->p, n);
      REQUIRE(q, "seed %" PRIu64 ": realloc(%p, %zu) failed", seed, (void *)k->p, n);
      blk_t nk = { q, n, 16, 0, next_tag++ };
      check_new(&nk, "realloc(huge)");
      size_t bad = verify(q, k->size, k->tag, k->size < n ? k->size : n);
      CHECK(bad == SIZE_MAX, "seed %" PRIu64 ": huge realloc %zu -> %zu (%p -> %p): byte %zu lost", seed, k->size, n,
            (void *)k->p, (void *)q, bad);
      fill(q, n, nk.tag);
      shadow_add(&nk);
      bytes = bytes - k->size + n;
      *k = nk;
      atomic_fetch_add(&nops[OP_HUGE_MOVE], 1);
    } else {                                         /* allocate: malloc, calloc or an aligned function */
      size_t n = pick_size(&r);
      blk_t k = { NULL, n, 16, 0, next_tag++ };
      uint64_t how = mt_rng_below(&r, 10);
      const char *what = "malloc";
      if (how < 6) {
        k.p = M_malloc(n);
        atomic_fetch_add(&nops[OP_MALLOC], 1);
      } else if (how < 8) {
        size_t cnt = 1 + mt_rng_below(&r, 4);
        k.size = n / cnt * cnt;
        k.p = M_calloc(cnt, n / cnt);
        what = "calloc";
        if (k.p) CHECK(is_zero(k.p, k.size), "calloc(%zu, %zu) = %p not zero", cnt, n / cnt, (void *)k.p);
        atomic_fetch_add(&nops[OP_CALLOC], 1);
      } else {
        unsigned lg = (unsigned)(mt_rng_below(&r, 100) < 95 ? 3 + mt_rng_below(&r, 10) : 13 + mt_rng_below(&r, 11));
        k.align = (size_t)1 << lg;                   /* 8 B .. 4 MiB */
        if (mt_rng_below(&r, 20) == 0 && bytes < MAX_LIVE_BYTES / 2) {   /* an aligned huge block */
          k.align = (size_t)1 << (21 + mt_rng_below(&r, 4));             /* 2 .. 16 MiB */
          k.size = n = (3u << 20) + mt_rng_below(&r, 12u << 20);
          atomic_fetch_add(&nops[OP_HUGE_ALIGNED], 1);
        }
        uint64_t fn = mt_rng_below(&r, 3);
        if (fn == 0) { k.p = M_aligned_alloc(k.align, n); what = "aligned_alloc"; }
        else if (fn == 1) { void *p = NULL; if (M_posix_memalign(&p, k.align, n) == 0) k.p = p; what = "posix_memalign"; }
        else { k.p = M_memalign(k.align, n); what = "memalign"; }
        atomic_fetch_add(&nops[OP_ALIGNED], 1);
      }
      REQUIRE(k.p, "seed %" PRIu64 ": %s(%zu, align %zu) failed: %s", seed, what, k.size, k.align, strerror(errno));
      check_new(&k, what);
      fill(k.p, k.size, k.tag);
      shadow_add(&k);
      live[nlive++] = k;
      bytes += k.size;
    }
  }
  while (nlive) release(&live[--nlive]);
  mt_leave();
  return NULL;
}

/* ---- side threads, running while the workers do ---- */
static _Atomic(int) side_stop;

/* mallard_collect (and malloc_trim where malloc is Mallard's) from a thread of its own. */
static void *collector(void *arg) {
  (void)arg;
  mt_started();
  for (unsigned i = 0; !atomic_load(&side_stop); i++) {
#ifndef MT_PREFIX
    if (i % 3 == 2) malloc_trim(0);
    else
#endif
      MT_COLLECT(i % 3 == 0);
    atomic_fetch_add(&nops[OP_COLLECT], 1);
    usleep(2000);
  }
  mt_leave();
  return NULL;
}

/* A short life: a few blocks, some left behind for the process to reuse. */
static void small_life(unsigned salt) {
  void *keep[16];
  for (unsigned i = 0; i < 16; i++) {
    size_t n = 16 + (i * 977 + salt) % 40000;
    keep[i] = M_malloc(n);
    REQUIRE(keep[i], "malloc(%zu)", n);
    mt_fill(keep[i], n, salt + i);
  }
  for (unsigned i = 0; i < 16; i++) {
    size_t n = 16 + (i * 977 + salt) % 40000;
    CHECK(mt_verify(keep[i], n, salt + i) == n, "block %u of a short-lived thread damaged", i);
    M_free(keep[i]);
  }
}

#ifndef MT_NO_FORK
/* fork while the workers allocate: the child allocates, frees, starts a thread and exits 0. */
static void *child_thread(void *arg) { small_life((unsigned)(uintptr_t)arg); return NULL; }
static void *forker(void *arg) {
  (void)arg;
  mt_started();
  for (unsigned i = 0; !atomic_load(&side_stop) && i < 40; i++) {
    int before = atomic_load(&mt_failures);
    spawn_begin();
    pid_t pid = fork();
    if (pid == 0) {
      small_life(i);
      pthread_t t;
      if (pthread_create(&t, NULL, child_thread, (void *)(uintptr_t)i) == 0) pthread_join(t, NULL);
      else CHECK(0, "pthread_create in a forked child failed");
      _exit(atomic_load(&mt_failures) != before ? 1 : 0);
    }
    spawn_end();
    REQUIRE(pid > 0, "fork: %s", strerror(errno));
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "seed %" PRIu64 ": forked child status 0x%x", seed, st);
    atomic_fetch_add(&nops[OP_FORK], 1);
    usleep(5000);
  }
  atomic_store(&forks_done, 1);
  return NULL;
}
#endif

/* Threads on user-supplied stacks (pthread_attr_setstack), joined: glibc frees their TLS with its stack lock held. */
static void *stack_thread(void *arg) { small_life((unsigned)(uintptr_t)arg); return NULL; }
static void *stack_spawner(void *arg) {
  (void)arg;
  mt_started();
  enum { STACK = 4 * 1024 * 1024 };   /* room for a sanitizer runtime's static TLS too */
  void *stack = mmap(NULL, STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(stack != MAP_FAILED, "mmap(stack)");
  for (unsigned i = 0; !atomic_load(&side_stop) && i < 200; i++) {
    pthread_attr_t at;
    pthread_attr_init(&at);
    REQUIRE(pthread_attr_setstack(&at, stack, STACK) == 0, "pthread_attr_setstack");
    pthread_t t;
    spawn_begin();
    int rc = pthread_create(&t, &at, stack_thread, (void *)(uintptr_t)i);
    pthread_attr_destroy(&at);
    REQUIRE(rc == 0, "pthread_create on a user stack: %d", rc);
    pthread_join(t, NULL);   /* the stack is reused by the next one only after the join */
    spawn_end();
    atomic_fetch_add(&nops[OP_STACK_THREAD], 1);
  }
  munmap(stack, STACK);
  mt_leave();
  return NULL;
}

#ifndef MT_TSAN
/* A TLS destructor that frees the block it is given and allocates in every round; it re-sets the key (another
 * round) until glibc's last round, where the block it allocates is freed at once. */
static pthread_key_t tls_key;
static __thread unsigned tls_rounds;
static void tls_destructor(void *v) {
  /* The block of round r has 24 + 100 r bytes and pattern r (round 0: the one the thread set). */
  size_t had = 24 + (size_t)tls_rounds * 100;
  CHECK(mt_verify(v, had, tls_rounds) == had, "TLS block of round %u damaged", tls_rounds);
  M_free(v);
  tls_rounds++;
  size_t n = 24 + (size_t)tls_rounds * 100;
  uint8_t *p = M_malloc(n);
  REQUIRE(p, "malloc in TLS destructor round %u", tls_rounds);
  mt_fill(p, n, tls_rounds);
  atomic_fetch_add(&nops[OP_TLS_ROUND], 1);
  if (tls_rounds < PTHREAD_DESTRUCTOR_ITERATIONS) pthread_setspecific(tls_key, p);
  else M_free(p);
}
static void *tls_thread(void *arg) {
  (void)arg;
  uint8_t *p = M_malloc(24);
  REQUIRE(p, "malloc(24)");
  mt_fill(p, 24, 0);
  pthread_setspecific(tls_key, p);
  small_life(7);
  return NULL;
}
static void *tls_spawner(void *arg) {
  (void)arg;
  mt_started();
  for (unsigned i = 0; !atomic_load(&side_stop) && i < 200; i++) {
    pthread_t t;
    spawn_begin();
    REQUIRE(pthread_create(&t, NULL, tls_thread, NULL) == 0, "pthread_create");
    pthread_join(t, NULL);
    spawn_end();
  }
  mt_leave();
  return NULL;
}
#endif

int main(int argc, char **argv) {
  const char *s = argc > 1 ? argv[1] : getenv("MALLARD_TEST_SEED");
  seed = s ? strtoull(s, NULL, 0) : ((uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20));
  printf("test_model (%s): seed %" PRIu64 " (replay: %s %" PRIu64 ", or MALLARD_TEST_SEED=%" PRIu64 ")\n", MT_MODE,
         seed, argv[0], seed, seed);
  fflush(stdout);
  spawn_serialized = getenv("MALLARD_TEST_QEMU") != NULL;
  double t0 = mt_now();
  pthread_t t[NTHREADS], side[4];
  int nside = 0;
#ifdef MT_NO_FORK
  atomic_store(&forks_done, 1);   /* no forker */
#endif
  spawn_begin();   /* no fork until every thread below runs */
  REQUIRE(!pthread_create(&side[nside++], NULL, collector, NULL), "create");
  REQUIRE(!pthread_create(&side[nside++], NULL, stack_spawner, NULL), "create");
#ifndef MT_TSAN
  REQUIRE(pthread_key_create(&tls_key, tls_destructor) == 0, "pthread_key_create");
  REQUIRE(!pthread_create(&side[nside++], NULL, tls_spawner, NULL), "create");
#endif
#ifndef MT_NO_FORK
  REQUIRE(!pthread_create(&side[nside++], NULL, forker, NULL), "create");
#endif
  for (uintptr_t i = 0; i < NTHREADS; i++) REQUIRE(!pthread_create(&t[i], NULL, thread_main, (void *)i), "create");
  while (spawn_serialized && atomic_load(&threads_running) < (unsigned)(nside + NTHREADS)) usleep(1000);
  spawn_end();
  for (int i = 0; i < NTHREADS; i++) pthread_join(t[i], NULL);
  atomic_store(&side_stop, 1);
  for (int i = 0; i < nside; i++) pthread_join(side[i], NULL);
  while (npool) release(&pool[--npool]);
  CHECK(nshadow == 0, "%zu blocks left in the shadow", nshadow);
  printf("ops: malloc %" PRIu64 ", calloc %" PRIu64 ", aligned %" PRIu64 ", realloc %" PRIu64 ", free %" PRIu64
         ", handed over %" PRIu64 ", adopted %" PRIu64 "; %.2f s\n",
         nops[OP_MALLOC], nops[OP_CALLOC], nops[OP_ALIGNED], nops[OP_REALLOC], nops[OP_FREE], nops[OP_HANDOFF],
         nops[OP_ADOPT], mt_now() - t0);
  printf("impossible requests %" PRIu64 ", huge moves %" PRIu64 ", aligned huge %" PRIu64 ", collects %" PRIu64
         ", forks %" PRIu64 ", user-stack threads %" PRIu64 ", TLS destructor rounds %" PRIu64 "\n",
         nops[OP_FAILED], nops[OP_HUGE_MOVE], nops[OP_HUGE_ALIGNED], nops[OP_COLLECT], nops[OP_FORK],
         nops[OP_STACK_THREAD], nops[OP_TLS_ROUND]);
  if (atomic_load(&mt_failures)) printf("FAILED with seed %" PRIu64 "\n", seed);
  return mt_result("test_model (" MT_MODE ")");
}
