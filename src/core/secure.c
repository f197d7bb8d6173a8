/* core/secure.c — the secure variant's randomness (ChaCha8 keystream per thread, seeded by getrandom), page keys, shuffle and failure report (compiled empty in the fast variant). */
#define _GNU_SOURCE
#include "core/core.h"
#include "core/secure.h"

#ifdef MALLARD_SECURE
#include <string.h>
#include <sys/auxv.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* A per-thread ChaCha keystream (8 rounds, as hardened_malloc) keyed with 32 bytes from getrandom: page keys,
 * allocation order and segment addresses are unpredictable from anything a program can observe. A thread's
 * generator is re-keyed when the process's seed generation changes (after fork, in the child). */
#define CHACHA_ROUNDS 8
typedef struct rng_s {
  uint32_t state[16];        /* constants, key, counter, nonce */
  uint32_t out[16];          /* the current keystream block */
  unsigned used;             /* words of `out` consumed */
  unsigned generation;       /* seed generation it was keyed in (0: never) */
} rng_t;
static __thread rng_t rng __attribute__((tls_model("initial-exec")));
static _Atomic(unsigned) seed_generation = 1;
static _Atomic(bool) weak_seed;      /* getrandom failed once: the fallback below was used */
static _Atomic(uint64_t) fallback_count;

/* The fallback when getrandom fails (no entropy yet at early boot, seccomp): the kernel's 16 random bytes for
 * this exec (AT_RANDOM), the clock, the thread's stack address and a counter, mixed. Weaker (AT_RANDOM is shared
 * by every thread and every fork child of the exec): noted, and announced under `verbose`. */
static void seed_fallback(uint8_t *key, size_t len) {
  atomic_store(&weak_seed, true);
  const uint8_t *at = mld_os_exec_random();
  uint64_t ns = mld_now_ns();
  uint64_t x = (ns % 1000000000u) ^ ((ns / 1000000000u) << 32) ^ (uint64_t)(uintptr_t)&ns ^
               ((uint64_t)getpid() << 40) ^ (atomic_fetch_add(&fallback_count, 1) * MLD_MIX);
  for (size_t i = 0; i < len; i++) {
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    key[i] ^= (uint8_t)(x >> 24) ^ (at ? at[i & 15] : 0);
  }
}

static void get_seed(void *buf, size_t len) {
  memset(buf, 0, len);
  if (!mld_os_random(buf, len)) seed_fallback(buf, len);
}

static void rng_block(rng_t *r);

/* The process's master generator, keyed from getrandom; it keys each thread's generator (no system call per
 * thread). Under a spin lock; re-keyed from getrandom in a fork child. */
static rng_t master;
static _Atomic(int) master_lock;

static void rng_init(rng_t *r, const void *key) {
  static const uint32_t sigma[4] = { 0x61707865, 0x3320646e, 0x79622d32, 0x6b206574 };   /* "expand 32-byte k" */
  memcpy(r->state, sigma, sizeof sigma);
  memcpy(&r->state[4], key, 32);
  memset(&r->state[12], 0, 16);   /* counter and nonce start at zero: each generator has its own key */
  r->used = 16;
  r->generation = atomic_load_explicit(&seed_generation, memory_order_relaxed);
}

static void rng_key(rng_t *r) {
  uint32_t key[8];
  mld_spin_lock(&master_lock);
  if (master.generation != atomic_load_explicit(&seed_generation, memory_order_relaxed)) {
    get_seed(key, sizeof key);
    rng_init(&master, key);
  }
  for (int i = 0; i < 8; i++) {
    if (master.used == 16) rng_block(&master);
    key[i] = master.out[master.used];
    master.out[master.used++] = 0;
  }
  mld_spin_unlock(&master_lock);
  rng_init(r, key);
  memset(key, 0, sizeof key);
}

#define ROTL(x, n) (((x) << (n)) | ((x) >> (32 - (n))))
#define QR(a, b, c, d) (a += b, d ^= a, d = ROTL(d, 16), c += d, b ^= c, b = ROTL(b, 12), \
                        a += b, d ^= a, d = ROTL(d, 8), c += d, b ^= c, b = ROTL(b, 7))
static void rng_block(rng_t *r) {
  uint32_t x[16];
  memcpy(x, r->state, sizeof x);
  for (int i = 0; i < CHACHA_ROUNDS; i += 2) {
    QR(x[0], x[4], x[8], x[12]); QR(x[1], x[5], x[9], x[13]); QR(x[2], x[6], x[10], x[14]); QR(x[3], x[7], x[11], x[15]);
    QR(x[0], x[5], x[10], x[15]); QR(x[1], x[6], x[11], x[12]); QR(x[2], x[7], x[8], x[13]); QR(x[3], x[4], x[9], x[14]);
  }
  for (int i = 0; i < 16; i++) r->out[i] = x[i] + r->state[i];
  if (++r->state[12] == 0) r->state[13]++;   /* 2^64 blocks per key */
  r->used = 0;
}

static uint32_t rng_next32(void) {
  rng_t *r = &rng;
  if (unlikely(r->generation != atomic_load_explicit(&seed_generation, memory_order_relaxed))) rng_key(r);
  if (unlikely(r->used == 16)) rng_block(r);
  uint32_t v = r->out[r->used];
  r->out[r->used++] = 0;   /* a keystream word is used once and not left in memory */
  return v;
}

uint64_t mld_random64(void) {
  uint64_t hi = rng_next32();
  return hi << 32 | rng_next32();
}

void mld_secure_init(void) { (void)rng_next32(); }   /* keys the initialising thread's generator */

bool mld_secure_weak_seed(void) { return atomic_load(&weak_seed); }

/* In the child after fork: every thread generator is re-keyed before its next use (only the forking thread
 * lives on, and it re-keys at once), so the child's page keys, allocation order and segment addresses owe
 * nothing to the parent's or a sibling's. Pages made before the fork keep their keys (see docs/SECURITY.md). */
void mld_secure_fork_child(void) {
  atomic_store_explicit(&master_lock, 0, memory_order_relaxed);   /* a thread that held it does not exist here */
  atomic_fetch_add_explicit(&seed_generation, 1, memory_order_relaxed);
  rng_key(&rng);   /* the master is re-keyed from getrandom first */
}

/* A page starts (or starts again): fresh keys; the alignment magic for its block size. */
void mld_secure_page_keys(page_t *pg) {
  pg->list_key = mld_random64();
  pg->start = (uintptr_t)page_start(pg);
  pg->align_magic = pg->block_size ? UINT64_MAX / pg->block_size + 1 : 0;
}

/* Fisher-Yates: freshly carved blocks are handed out in random order. Each index takes 16 random bits (two per
 * keystream word), scaled by a multiply and rejected in the rare biased case (Lemire's method): unbiased, and no
 * division on the common path. n < 2^16 (at most MLD_SHUFFLE_MAX blocks, page.c). */
void mld_shuffle(block_t **blocks, size_t n) {
  uint32_t word = 0;
  unsigned halves = 0;
  for (size_t i = n; i > 1; i--) {
    uint32_t bound = (uint32_t)i, m, low;
    do {
      if (!halves) {
        word = rng_next32();
        halves = 2;
      }
      m = (word & 0xffff) * bound;   /* < 2^32: its top 16 bits are a draw in [0, i) */
      word >>= 16;
      halves--;
      low = m & 0xffff;
    } while (low < bound && low < (0x10000u - bound) % bound);   /* the (0x10000 mod i) over-represented draws */
    size_t j = m >> 16;
    block_t *t = blocks[i - 1];
    blocks[i - 1] = blocks[j];
    blocks[j] = t;
  }
}

uintptr_t mld_random_hint(void) {
  /* A random 4 MiB-aligned address between 1 TiB and 64 TiB: segment addresses are not predictable. */
  uint64_t r = mld_random64();
  return (uintptr_t)((((r % ((1ull << 46) - (1ull << 40))) + (1ull << 40)) >> MLD_SEGMENT_SHIFT) << MLD_SEGMENT_SHIFT);
}

void mld_secure_report(const char *what, const void *p) {
  mld_fatal("mallard-secure: %s %p; aborting\n", what, p);
}

/* mld_secure_fail's target (secure.h): it aligns the stack and calls mld_secure_report (platform.h). */
MLD_COLD_ENTRY(mld_secure_fail_entry, mld_secure_report);
#endif
