/* guarded/guarded.c — sampled guarded allocations: the slot pool (one data page between guard pages), its sampling draws,
 * the slack check at free, and the SIGSEGV/SIGBUS handler that reports overflows and uses after free. */
#define _GNU_SOURCE
#include "guarded/guarded.h"
#include "prof/prof.h"
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* ---- the pool ----
 * Pages: [guard][data 0][guard][data 1][guard] ... [data n-1][guard]: slot i's data page is page 2i+1, every even
 * page is a guard (PROT_NONE for good), so an overflow past a block and an underflow before it both fault. The
 * reservation is aligned to a segment and a whole number of segments long, so no 4 MiB granule of Mallard's
 * ownership map ever covers a pool address (a pool pointer always reads "not ours" there and comes here). */
_Atomic(uintptr_t) mld_guard_base;
size_t mld_guard_len;

enum { SLOT_UNUSED = 0, SLOT_LIVE = 1, SLOT_FREED = 2 };
#define NO_SLOT UINT32_MAX
#define FILL 0xd7                         /* the bytes of a data page around its block: checked when it is freed */

typedef struct slot_s {
  uintptr_t addr;                          /* the block (live or freed) */
  size_t size;                             /* its requested size (its usable size too) */
  _Atomic(uint8_t) state;                  /* SLOT_*: written under the pool lock; the fault handler reads it */
  _Atomic(uint8_t) retired;                /* guard_action:report opened one of its pages: never protected again */
  uint8_t alloc_depth, free_depth;
  uint32_t alloc_tid, free_tid;
  uint32_t next;                           /* the freed-slot FIFO */
  uintptr_t alloc_pcs[MLD_GUARD_DEPTH], free_pcs[MLD_GUARD_DEPTH];
} slot_t;

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static slot_t *slots;                      /* metadata, mapped beside the pool */
static uint32_t nslots, next_unused;       /* slots below next_unused have been handed out at least once */
static uint32_t fifo_head = NO_SLOT, fifo_tail = NO_SLOT;   /* freed slots, least recently freed first */
static bool pool_failed;                   /* the reservation failed once: never tried again */
static _Atomic(uint64_t) st_samples, st_live, st_skipped, st_reports;
static struct sigaction prev_segv, prev_bus;   /* the handlers before ours: faults outside the pool go there */
static void on_fault(int sig, siginfo_t *si, void *ctx);

static uintptr_t data_page(uint32_t i) {
  return atomic_load_explicit(&mld_guard_base, memory_order_relaxed) + (2 * (size_t)i + 1) * mld_os_page();
}

/* Pool lock held. One reservation (PROT_NONE, no memory committed) and the handler; false when it cannot be had. */
static bool pool_make(void) {
  if (atomic_load_explicit(&mld_guard_base, memory_order_relaxed)) return true;
  if (pool_failed) return false;
  pool_failed = true;
  uint32_t n = mld_opt.guard_slots ? mld_opt.guard_slots : 1;
  size_t pages = 2 * (size_t)n + 1;
  size_t len = (pages * mld_os_page() + MLD_SEGMENT_SIZE - 1) & ~(size_t)MLD_SEGMENT_MASK;
  size_t meta = mld_page_round((size_t)n * sizeof(slot_t));   /* n <= MLD_GUARD_SLOTS_MAX: no wrap */
  uint8_t *raw = mld_os_map_plain(len + MLD_SEGMENT_SIZE, false);   /* PROT_NONE: pages open one by one */
  if (!raw) return false;
  uint8_t *base = (uint8_t *)(((uintptr_t)raw + MLD_SEGMENT_MASK) & ~(uintptr_t)MLD_SEGMENT_MASK);
  if (base > raw) mld_os_unmap_plain(raw, (size_t)(base - raw));
  if (raw + MLD_SEGMENT_SIZE > base) mld_os_unmap_plain(base + len, (size_t)(raw + MLD_SEGMENT_SIZE - base));
  void *m = mld_os_map_plain(meta, true);
  if (!m) { mld_os_unmap_plain(base, len); return false; }
  mld_os_name(base, len, "mallard guarded pool");
  slots = m;
  nslots = n;
  mld_guard_len = len;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;   /* on the program's alternate stack if it has one (stack overflows) */
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &prev_segv);
  sigaction(SIGBUS, &sa, &prev_bus);
  atomic_store_explicit(&mld_guard_base, (uintptr_t)base, memory_order_release);   /* after mld_guard_len */
  pool_failed = false;
  return true;
}

/* ---- sampling draws: a per-thread xorshift64* (not a secret: only where samples fall) ---- */
static __thread uint64_t tls_rng;

static uint64_t rng_next(void) { return mld_xorshift64s(&tls_rng); }

static void rng_seed(void) {
  uint64_t ns = mld_now_ns();
  uint64_t s = ((ns % 1000000000u) << 20) ^ (ns / 1000000000u) ^ ((uintptr_t)&tls_rng * 0x9E3779B97F4A7C15ULL);
  s ^= s >> 31; s *= 0xBF58476D1CE4E5B9ULL; s ^= s >> 29;
  tls_rng = s ? s : 1;
}

static uint64_t draw(void) {
  uint64_t n = mld_opt.guard_sample;      /* 1..2^40: 2n - 1 cannot overflow */
  return 1 + rng_next() % (2 * n - 1);    /* uniform in [1, 2n - 1]: mean n */
}

bool mld_guard_take(size_t size, uint64_t *left) {
  if (!mld_opt.guard_sample) { *left = INT64_MAX; return false; }
  if (mld_self_alloc) { *left = 0; return false; }    /* the allocator's own allocations (the unwinder's): never */
  if (!tls_rng) {                                      /* this thread's first draw: does it fall inside this allocation? */
    rng_seed();
    uint64_t d = draw();
    if (d >= size) { *left = d - size; return false; }
  }
  *left = draw();
  return true;
}

void mld_guard_note_skipped(void) { atomic_fetch_add_explicit(&st_skipped, 1, memory_order_relaxed); }

/* The stack of the call whose return address is ra (prof_stack.c's unwinder when loaded; ra alone otherwise). */
static uint8_t capture(uintptr_t *pcs, const void *ra) {
  bool was_busy = mld_self_alloc;
  mld_self_alloc = true;                    /* the loader's allocations are neither sampled nor guarded */
  if (mld_prof_safe_context()) mld_prof_unwinder_load();
  unsigned n = mld_prof_backtrace(pcs, MLD_GUARD_DEPTH, (uintptr_t)ra);
  mld_self_alloc = was_busy;
  return (uint8_t)n;
}


/* ---- reports: async-signal-safe (the fault handler writes them): no stdio, no allocation ---- */
typedef struct out_s { char buf[2048]; size_t n; } out_t;

static void put(out_t *o, const char *s) {
  while (*s && o->n < sizeof o->buf) o->buf[o->n++] = *s++;
}
static void put_hex(out_t *o, uintptr_t x) {
  char t[19];
  int i = 18;
  t[i] = 0;
  do { t[--i] = "0123456789abcdef"[x & 15]; x >>= 4; } while (x);
  t[--i] = 'x';
  t[--i] = '0';
  put(o, t + i);
}
static void put_dec(out_t *o, uint64_t x) {
  char t[21];
  int i = 20;
  t[i] = 0;
  do { t[--i] = (char)('0' + x % 10); x /= 10; } while (x);
  put(o, t + i);
}
static void flush(out_t *o) {
  for (size_t off = 0; off < o->n;) {
    ssize_t w = write(2, o->buf + off, o->n - off);
    if (w <= 0) break;
    off += (size_t)w;
  }
  o->n = 0;
}

#ifdef MALLARD_SECURE
#define WHO "mallard-secure: guarded allocation: "
#else
#define WHO "mallard: guarded allocation: "
#endif

static void put_stack(out_t *o, const char *what, uint32_t t, const uintptr_t *pcs, unsigned n) {
  put(o, "  ");
  put(o, what);
  put(o, " by thread ");
  put_dec(o, t);
  put(o, ":\n");
  for (unsigned i = 0; i < n && i < MLD_GUARD_DEPTH; i++) {
    put(o, "    #");
    put_dec(o, i);
    put(o, " ");
    put_hex(o, pcs[i]);
    put(o, "\n");
  }
}

/* "block 0x... of N bytes (live|freed)", without the line's end. */
static void put_block(out_t *o, const slot_t *s) {
  put(o, "block ");
  put_hex(o, s->addr);
  put(o, " of ");
  put_dec(o, s->size);
  put(o, atomic_load_explicit(&s->state, memory_order_acquire) == SLOT_FREED ? " bytes (freed)" : " bytes (live)");
}
/* The block's allocation stack, and its free stack once freed. */
static void put_stacks(out_t *o, const slot_t *s) {
  put_stack(o, "allocated", s->alloc_tid, s->alloc_pcs, s->alloc_depth);
  if (atomic_load_explicit(&s->state, memory_order_acquire) == SLOT_FREED)
    put_stack(o, "freed", s->free_tid, s->free_pcs, s->free_depth);
}

/* After a report: abort (guard_action:abort), or go on (report). */
static void finish(out_t *o) {
  atomic_fetch_add_explicit(&st_reports, 1, memory_order_relaxed);
  if (mld_opt.guard_action == MLD_GUARD_ABORT) {
    put(o, WHO "aborting (guard_action:abort)\n");
    flush(o);
    abort();
  }
  put(o, WHO "the program goes on (guard_action:report)\n");
  flush(o);
}

/* ---- allocation and free ---- */
static void fill(uint8_t *p, size_t n) { memset(p, FILL, n); }
/* The first byte of [p, p+n) that is not FILL, or NULL. */
static const uint8_t *damaged(const uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++) if (p[i] != FILL) return p + i;
  return NULL;
}

/* Pool lock held: slot i goes to the end of the freed-slot FIFO. */
static void fifo_push(uint32_t i) {
  slots[i].next = NO_SLOT;
  if (fifo_tail == NO_SLOT) fifo_head = i; else slots[fifo_tail].next = i;
  fifo_tail = i;
}

void *mld_guard_alloc(size_t size, size_t align, bool zero, const void *ra) {
  (void)zero;   /* a slot's data page is zero whenever it is handed out: fresh, or emptied (MADV_DONTNEED) at free */
  if (size == 0 || size > MLD_GUARD_MAX_SIZE || align > mld_os_page()) { mld_guard_note_skipped(); return NULL; }
  if (align < MLD_MIN_ALIGN) align = MLD_MIN_ALIGN;
  uintptr_t pcs[MLD_GUARD_DEPTH];
  uint8_t depth = capture(pcs, ra);   /* before the lock: the unwinder may load (dlopen) */
  pthread_mutex_lock(&pool_lock);
  uint32_t i = NO_SLOT;
  if (pool_make()) {
    if (next_unused < nslots) i = next_unused++;   /* never-used slots first: freed ones stay protected longest */
    while (i == NO_SLOT && fifo_head != NO_SLOT) {
      i = fifo_head;
      fifo_head = slots[i].next;
      if (fifo_head == NO_SLOT) fifo_tail = NO_SLOT;
      if (atomic_load_explicit(&slots[i].retired, memory_order_acquire)) i = NO_SLOT;   /* opened by a report: dropped */
    }
  }
  pthread_mutex_unlock(&pool_lock);
  if (i == NO_SLOT) {
    mld_guard_note_skipped();
    return NULL;
  }
  /* Slot i is this thread's alone until it is published LIVE (it is neither unused nor on the FIFO): its page is
   * opened and filled without the lock, so that samples in other threads do not wait behind a system call. */
  uint8_t *page = (uint8_t *)data_page(i);
  if (!mld_os_protect(page, mld_os_page(), true)) {   /* no memory for the page tables: back on the FIFO */
    pthread_mutex_lock(&pool_lock);
    fifo_push(i);
    pthread_mutex_unlock(&pool_lock);
    mld_guard_note_skipped();
    return NULL;
  }
  /* The block ends as close to the guard as 16-byte (or the requested) alignment allows; the rest of the page is
   * filled, so that a write into the slack before or after it is found when it is freed. */
  size_t rounded = (size + MLD_MIN_ALIGN - 1) & ~(size_t)(MLD_MIN_ALIGN - 1);   /* size <= one page: no overflow */
  uint8_t *p = (uint8_t *)(((uintptr_t)page + mld_os_page() - rounded) & ~(uintptr_t)(align - 1));
  fill(page, (size_t)(p - page));
  fill(p + size, (size_t)(page + mld_os_page() - (p + size)));
  slot_t *s = &slots[i];
  s->addr = (uintptr_t)p;
  s->size = size;
  s->alloc_depth = depth;
  memcpy(s->alloc_pcs, pcs, depth * sizeof *pcs);
  s->alloc_tid = mld_os_tid();
  s->free_depth = 0;
  atomic_store_explicit(&s->state, SLOT_LIVE, memory_order_release);
  atomic_fetch_add_explicit(&st_samples, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&st_live, 1, memory_order_relaxed);
  return p;
}

/* The slot whose data page holds p; NO_SLOT for a guard page. */
static uint32_t slot_of(const void *p) {
  size_t page = ((uintptr_t)p - atomic_load_explicit(&mld_guard_base, memory_order_relaxed)) / mld_os_page();
  if (!(page & 1) || page / 2 >= nslots) return NO_SLOT;
  return (uint32_t)(page / 2);
}

/* A free, realloc or size query of a pointer in the pool that is not a live block's start. Lock not held. */
static void report_invalid(const char *what, const void *p, uint32_t i) {
  out_t o = { .n = 0 };
  put(&o, WHO);
  put(&o, what);
  put(&o, "(");
  put_hex(&o, (uintptr_t)p);
  put(&o, strcmp(what, "free") ? "): invalid pointer " : "): double free or invalid free of ");
  put_hex(&o, (uintptr_t)p);
  if (i == NO_SLOT || atomic_load_explicit(&slots[i].state, memory_order_acquire) == SLOT_UNUSED) {
    put(&o, ": not a block of the guarded pool\n");
  } else {
    slot_t *s = &slots[i];
    put(&o, s->addr == (uintptr_t)p && atomic_load_explicit(&s->state, memory_order_acquire) == SLOT_FREED
                ? ": already freed: " : ": not the start of ");
    put_block(&o, s);
    put(&o, "\n");
    put_stacks(&o, s);
  }
  finish(&o);
}

void mld_guard_free(void *p, const void *ra) {
  uint32_t i = slot_of(p);
  uintptr_t pcs[MLD_GUARD_DEPTH];
  uint8_t depth = capture(pcs, ra);
  pthread_mutex_lock(&pool_lock);
  slot_t *s = i == NO_SLOT ? NULL : &slots[i];
  if (!s || atomic_load_explicit(&s->state, memory_order_acquire) != SLOT_LIVE || s->addr != (uintptr_t)p) {
    pthread_mutex_unlock(&pool_lock);
    report_invalid("free", p, i);
    return;
  }
  s->free_depth = depth;
  memcpy(s->free_pcs, pcs, depth * sizeof *pcs);
  s->free_tid = mld_os_tid();
  atomic_store_explicit(&s->state, SLOT_FREED, memory_order_release);
  pthread_mutex_unlock(&pool_lock);
  /* The slot is this thread's alone again (FREED, not yet on the FIFO): its slack is checked and its page closed
   * without the lock; it goes on the FIFO last, so its record stays until the report below is out. */
  uint8_t *page = (uint8_t *)data_page(i), *end = page + mld_os_page();
  const uint8_t *under = damaged(page, (size_t)((uint8_t *)p - page));
  const uint8_t *over = damaged((uint8_t *)p + s->size, (size_t)(end - ((uint8_t *)p + s->size)));
  bool reuse = !atomic_load_explicit(&s->retired, memory_order_acquire);
  if (reuse) {
    mld_os_protect(page, mld_os_page(), false);      /* a use after free faults from here on */
    mld_os_purge(page, mld_os_page());               /* the memory goes back; the page reads zero when reused */
  }   /* else: opened by a report (guard_action:report) for good: the slot is not reused */
  atomic_fetch_sub_explicit(&st_live, 1, memory_order_relaxed);
  if (under || over) {
    out_t o = { .n = 0 };
    put(&o, WHO);
    put(&o, over ? "heap buffer overflow: bytes past the end of " : "heap buffer underflow: bytes before ");
    put_block(&o, s);
    put(&o, " were written (found when it was freed; first damaged byte at ");
    put_hex(&o, (uintptr_t)(over ? over : under));
    put(&o, ")\n");
    put_stacks(&o, s);
    finish(&o);   /* returns under guard_action:report */
  }
  if (reuse) {
    pthread_mutex_lock(&pool_lock);
    fifo_push(i);
    pthread_mutex_unlock(&pool_lock);
  }
}

size_t mld_guard_size(const void *p, const char *what) {
  uint32_t i = slot_of(p);
  if (i != NO_SLOT) {
    slot_t *s = &slots[i];
    pthread_mutex_lock(&pool_lock);
    size_t n = atomic_load_explicit(&s->state, memory_order_acquire) == SLOT_LIVE && s->addr == (uintptr_t)p ? s->size : 0;
    pthread_mutex_unlock(&pool_lock);
    if (n) return n;
  }
  report_invalid(what, p, i);
  return 0;
}

/* ---- the fault handler ---- */
/* A fault at a in the pool: which block it concerns, and how. In a data page: its block (freed: use after free; live:
 * an access before the block, below its slack). In a guard page: the nearer of the blocks on either side. */
static void report_fault(uintptr_t a) {
  uintptr_t base = atomic_load_explicit(&mld_guard_base, memory_order_relaxed);
  size_t page = (a - base) / mld_os_page();
  uint32_t i = NO_SLOT;
  const char *kind = "invalid access to the guarded pool";
  if (page & 1) {
    i = (uint32_t)(page / 2);
    if (i >= nslots || atomic_load_explicit(&slots[i].state, memory_order_acquire) == SLOT_UNUSED) i = NO_SLOT;
    else if (atomic_load_explicit(&slots[i].state, memory_order_acquire) == SLOT_FREED) kind = "use after free";
    else kind = a < slots[i].addr ? "heap buffer underflow" : "heap buffer overflow";
  } else {
    /* guard page 2j sits after slot j-1's data page and before slot j's */
    uint32_t before = page >= 2 ? (uint32_t)(page / 2 - 1) : NO_SLOT, after = (uint32_t)(page / 2);
    if (before != NO_SLOT && (before >= nslots || atomic_load_explicit(&slots[before].state, memory_order_acquire) == SLOT_UNUSED)) before = NO_SLOT;
    if (after >= nslots || atomic_load_explicit(&slots[after].state, memory_order_acquire) == SLOT_UNUSED) after = NO_SLOT;
    uintptr_t d_before = before != NO_SLOT ? a - (slots[before].addr + slots[before].size) : UINTPTR_MAX;
    uintptr_t d_after = after != NO_SLOT ? slots[after].addr - a : UINTPTR_MAX;
    if (before != NO_SLOT && d_before <= d_after) { i = before; kind = "heap buffer overflow"; }
    else if (after != NO_SLOT) { i = after; kind = "heap buffer underflow"; }
  }
  out_t o = { .n = 0 };
  put(&o, WHO);
  put(&o, kind);
  put(&o, " at ");
  put_hex(&o, a);
  if (i != NO_SLOT) {
    slot_t *s = &slots[i];
    if (a >= s->addr + s->size) { put(&o, ": "); put_dec(&o, a - (s->addr + s->size)); put(&o, " bytes past the end of "); }
    else if (a < s->addr) { put(&o, ": "); put_dec(&o, s->addr - a); put(&o, " bytes before "); }
    else { put(&o, ": "); put_dec(&o, a - s->addr); put(&o, " bytes into "); }
    put_block(&o, s);
    put(&o, "\n");
    put_stacks(&o, s);
  } else {
    put(&o, "\n");
  }
  if (mld_opt.guard_action == MLD_GUARD_REPORT) {
    /* the page opens for good, and every slot it touches is never protected nor reused again */
    if (page / 2 < nslots) atomic_store(&slots[page / 2].retired, 1);        /* data page's slot, or the one after */
    if (!(page & 1) && page >= 2 && page / 2 - 1 < nslots) atomic_store(&slots[page / 2 - 1].retired, 1);
    mld_os_protect((void *)(base + page * mld_os_page()), mld_os_page(), true);
  }
  finish(&o);
}

static void on_fault(int sig, siginfo_t *si, void *ctx) {
  /* si_code > 0: raised by the kernel for an access (not sent by kill or raise) */
  if (si && si->si_code > 0 && mld_guard_owns(si->si_addr)) {
    report_fault((uintptr_t)si->si_addr);
    return;   /* guard_action:report: the page is open now, the access runs again and succeeds */
  }
  struct sigaction *prev = sig == SIGBUS ? &prev_bus : &prev_segv;
  if (prev->sa_flags & SA_SIGINFO) { prev->sa_sigaction(sig, si, ctx); return; }
  if (prev->sa_handler != SIG_DFL && prev->sa_handler != SIG_IGN) { prev->sa_handler(sig); return; }
  if (prev->sa_handler == SIG_IGN && (!si || si->si_code <= 0)) return;   /* a sent signal the program ignores */
  /* No handler before ours: the default action, as if we had never been here. A fault happens again on return and
   * kills the process with its signal; a sent signal is raised again (it is blocked until this handler returns). */
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, NULL);
  if (!si || si->si_code <= 0) raise(sig);
}

/* ---- statistics and fork ---- */
void mld_guard_stats(guard_stats_t *out) {
  out->samples = atomic_load_explicit(&st_samples, memory_order_relaxed);
  out->live = atomic_load_explicit(&st_live, memory_order_relaxed);
  out->skipped = atomic_load_explicit(&st_skipped, memory_order_relaxed);
  out->reports = atomic_load_explicit(&st_reports, memory_order_relaxed);
  out->slots = atomic_load_explicit(&mld_guard_base, memory_order_acquire) ? nslots : 0;
}

void mld_guard_fork_prepare(void) { pthread_mutex_lock(&pool_lock); }
void mld_guard_fork_parent(void) { pthread_mutex_unlock(&pool_lock); }
void mld_guard_fork_child(void) { pthread_mutex_init(&pool_lock, NULL); }
