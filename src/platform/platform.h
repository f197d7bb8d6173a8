/* platform/platform.h — the platform layer: everything that differs between machines and C libraries (mappings,
 * purging, protection, clocks, CPU count, messages, CPU hints); the layers above reach the OS only through it. */
#ifndef MALLARD_PLATFORM_H
#define MALLARD_PLATFORM_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>
#include <sched.h>

#define MLD_EXPORT __attribute__((visibility("default")))
#define MLD_HIDDEN __attribute__((visibility("hidden")))
#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)
#define MLD_NOINLINE __attribute__((noinline))
#define MLD_CACHE_LINE 64
/* The hot entry points (malloc, free, new, sized delete, calloc) start a cache line: their code's place in the line
 * no longer moves with unrelated code elsewhere in the library (glibc-thread's rate moved x0.90-1.00 with a 16-byte
 * shift of malloc and free on the AMD machine of docs/PERFORMANCE.md's thirty-first pass). */
#define MLD_HOT_ENTRY __attribute__((aligned(MLD_CACHE_LINE)))
/* The user address space the allocator covers (its ownership map, its largest request): x86-64's 47 bits; aarch64
 * Linux maps user memory below 2^48 (mmap goes higher only when asked, with a hint above it). */
#if defined(__aarch64__)
#define MLD_ADDR_BITS 48
#else
#define MLD_ADDR_BITS 47
#endif
#define MLD_OS_PAGE_MIN 4096                              /* the page sizes supported: 4 KiB .. 64 KiB, powers of two */
#define MLD_OS_PAGE_MAX 65536

/* The page size in force, read once (getauxval(AT_PAGESZ), else sysconf; a test build's MALLARD_TEST_PAGE_SIZE when
 * larger): the granule of every mapping, purge and protection. Valid from the first call, before initialisation. */
extern _Atomic(size_t) mld_os_page_v MLD_HIDDEN;
MLD_HIDDEN size_t mld_os_page_init(void);
static inline size_t mld_os_page(void) {
  size_t p = atomic_load_explicit(&mld_os_page_v, memory_order_relaxed);
  return likely(p != 0) ? p : mld_os_page_init();
}
/* x rounded up to a multiple of the page, or 0 when that would wrap (x > SIZE_MAX - page + 1). */
static inline size_t mld_page_round(size_t x) {
  size_t m = mld_os_page() - 1;
  return x > SIZE_MAX - m ? 0 : (x + m) & ~m;
}

/* os.c: mappings, purging, clocks, CPU count */
/* hint: an address to try first (0: just below the previous aligned mapping) */
MLD_HIDDEN void *mld_os_map_aligned(size_t size, size_t align, uintptr_t hint);
MLD_HIDDEN void mld_os_unmap(void *p, size_t size);
MLD_HIDDEN bool mld_os_purge(void *p, size_t size);               /* false: the memory was not released */
MLD_HIDDEN void mld_os_thp(void *p, size_t size, int advice);       /* 1: huge pages, -1: none, 0: the default */
MLD_HIDDEN void *mld_os_resize(void *old, size_t old_size, size_t new_size);   /* in place; NULL: it cannot */
/* Moves a mapping (no copy) to a new aligned range of new_size bytes, tried first at hint (as mld_os_map_aligned);
 * NULL: not moved (still at old). */
MLD_HIDDEN void *mld_os_move(void *old, size_t old_size, size_t new_size, size_t align, uintptr_t hint);
MLD_HIDDEN bool mld_os_init(void);
MLD_HIDDEN void mld_os_name(void *p, size_t size, const char *name);
MLD_HIDDEN uint64_t mld_now_ms(void);
/* A full memory barrier run on every thread of the process (membarrier(2), private expedited: threads running now are
 * interrupted for it, the others pass one when next scheduled): after it returns, whatever a thread loads saw the
 * caller's earlier stores, and the caller sees whatever the thread stored before that point. false where the kernel
 * (or an emulator, a seccomp filter) does not offer it: the caller must then do without. */
MLD_HIDDEN bool mld_os_barrier_all(void);
MLD_HIDDEN void mld_os_barrier_register(void);   /* cheap while one thread runs: at init and in a fork child */
MLD_HIDDEN uint64_t mld_now_ns(void);                               /* CLOCK_MONOTONIC, ns */
MLD_HIDDEN uint64_t mld_realtime_ns(void);                          /* CLOCK_REALTIME, ns since the epoch */
/* Mappings outside the allocator's accounting (the profiler's tables, the guarded pool): NULL on failure. */
MLD_HIDDEN void *mld_os_map_plain(size_t size, bool accessible);   /* accessible: read-write; else PROT_NONE, no reserve */
MLD_HIDDEN void mld_os_unmap_plain(void *p, size_t size);
MLD_HIDDEN void *mld_os_remap_plain(void *p, size_t old_size, size_t new_size);   /* may move; NULL: unchanged */
MLD_HIDDEN bool mld_os_protect(void *p, size_t size, bool accessible);           /* false: mprotect failed */
/* A detached thread that starts with every signal blocked (it never runs the program's handlers) and runs boot->fn;
 * stack_size 0: the default. Returns pthread_create's result at once: boot (static, the caller's) records when the
 * thread runs, for mld_thread_wait_started. */
typedef struct { void *(*fn)(void *); _Atomic(int) started; } mld_thread_boot_t;
MLD_HIDDEN int mld_thread_start(pthread_t *t, mld_thread_boot_t *boot, size_t stack_size);
/* Returns once the thread started with boot runs: under qemu-user a new thread takes qemu's own clone lock once more
 * after its creator's pthread_create has returned, and a fork at that moment leaves the lock held in the child for
 * ever (docs/PLATFORMS.md). */
MLD_HIDDEN void mld_thread_wait_started(mld_thread_boot_t *boot);
MLD_HIDDEN bool mld_os_random(void *buf, size_t len);              /* the kernel's entropy, without blocking */
MLD_HIDDEN const uint8_t *mld_os_exec_random(void);                 /* AT_RANDOM: 16 bytes per exec, or NULL */
MLD_HIDDEN uint32_t mld_os_tid(void);
/* A CLOCK_MONOTONIC deadline wait_ms from now, for pthread_cond_timedwait on a condition using that clock. */
struct timespec;
MLD_HIDDEN void mld_deadline_after_ms(struct timespec *ts, uint64_t wait_ms);
/* Another process's memory (process_vm_readv: the same user, ptrace rules applying, or root): bytes read, or -1
 * with errno. Entries are (local, remote) address and length pairs, n of each. */
struct iovec;
MLD_HIDDEN long mld_os_read_process(int pid, const struct iovec *local, const struct iovec *remote, unsigned long n);
MLD_HIDDEN long mld_os_getdents(int fd, void *buf, size_t len);    /* getdents64: bytes, 0 at the end, -1 */
MLD_HIDDEN size_t mld_ncpus(void);
MLD_HIDDEN size_t mld_ncpus_of(int pid);                            /* another process's CPUs (0: this one) */
extern _Atomic(uint64_t) mld_mapped_bytes MLD_HIDDEN;

/* One step of xorshift64* over *state (non-zero): the samplers' draws (prof.c, guarded.c), which need no secret. */
static inline uint64_t mld_xorshift64s(uint64_t *state) {
  uint64_t x = *state;
  x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
  *state = x;
  return x * 0x2545F4914F6CDD1DULL;
}

/* diag.c */
MLD_HIDDEN void mld_report_invalid(const char *what, const void *p);
extern _Atomic(uint64_t) mld_invalid_count MLD_HIDDEN;
MLD_HIDDEN void mld_message(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
MLD_HIDDEN void mld_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
MLD_HIDDEN const char *mld_errname(int err);   /* "EACCES"...; "error" when unknown; never allocates */

/* ---- race-window widening (test builds with MALLARD_RACE_DELAY): a short random pause where memory changes hands */
#ifdef MALLARD_RACE_DELAY
MLD_HIDDEN void mld_race_delay(void);
MLD_HIDDEN void mld_race_delay_sometimes(void);
#define MLD_RACE_WINDOW() mld_race_delay()
/* On a path every free takes: one call in 64 of the thread's pauses (every one made the race build's tests crawl;
 * MALLARD_RACE_FREE_PERIOD=N: one in N). */
#define MLD_RACE_WINDOW_SOMETIMES() mld_race_delay_sometimes()
#else
#define MLD_RACE_WINDOW() ((void)0)
#define MLD_RACE_WINDOW_SOMETIMES() ((void)0)
#endif

/* ---- a spin lock for locks that are almost never contended (the heap lock: its owner against a sweep) ---- */
static inline bool mld_spin_trylock(_Atomic(int) *l) {
  return !atomic_load_explicit(l, memory_order_relaxed) && !atomic_exchange_explicit(l, 1, memory_order_acquire);
}
static inline void mld_spin_lock(_Atomic(int) *l) {
  while (!mld_spin_trylock(l)) sched_yield();   /* held by a sweep (or another exiting thread): short */
}
static inline void mld_spin_unlock(_Atomic(int) *l) { atomic_store_explicit(l, 0, memory_order_release); }

/* The compiler forgets how x was computed: one register holds it, instead of the address arithmetic being folded
 * again into each access (which, on the secure variant's free path, cost four saved registers). */
#define mld_keep_in_register(x) __asm__("" : "+r"(x))

/* ---- the CPU: what differs between architectures, in one place (x86-64 first; any other: portable C) ---- */
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define MLD_TSAN_BUILD 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define MLD_TSAN_BUILD 1
#endif

/* Bit i (mod 64) of v. x86-64: `bt` reads it into the carry flag (no shift-and-mask chain on the fast paths). */
static inline bool mld_bit_test(uint64_t v, uint64_t i) {
#if defined(__x86_64__)
  bool set;
  __asm__("btq %2, %1" : "=@ccc"(set) : "r"(v), "r"(i));
  return set;
#else
  return (v >> (i & 63)) & 1;
#endif
}
/* Sets bit i (mod 64) of *v; returns its old value. */
static inline bool mld_bit_test_set(uint64_t *v, uint64_t i) {
  bool was;
#if defined(__x86_64__)
  __asm__("btsq %2, %1" : "=@ccc"(was), "+r"(*v) : "r"(i));
#else
  was = (*v >> (i & 63)) & 1;
  *v |= (uint64_t)1 << (i & 63);
#endif
  return was;
}
/* Clears bit i (mod 64) of *v; returns its old value. */
static inline bool mld_bit_test_reset(uint64_t *v, uint64_t i) {
  bool was;
#if defined(__x86_64__)
  __asm__("btrq %2, %1" : "=@ccc"(was), "+r"(*v) : "r"(i));
#else
  was = (*v >> (i & 63)) & 1;
  *v &= ~((uint64_t)1 << (i & 63));
#endif
  return was;
}
/* Zeroes n bytes. x86-64: `rep stosb` inline, since a call to memset would make its caller (a free fast path) save
 * and restore registers on every call, wiping or not. */
static inline void mld_wipe(void *p, size_t n) {
#if defined(__x86_64__)
  __asm__ volatile("rep stosb" : "+D"(p), "+c"(n) : "a"(0) : "memory");
#else
  __builtin_memset(p, 0, n);
#endif
}
/* *x -= 1 with release semantics (the caller's earlier writes are visible before it); returns the new value. On
 * x86-64 a store is never reordered with earlier stores: a compiler barrier makes the plain decrement a release
 * (one `sub` with memory); elsewhere, and under ThreadSanitizer (which must see the release), an atomic store. */
static inline uint32_t mld_dec_release_u32(uint32_t *x) {
#if defined(__x86_64__) && !defined(MLD_TSAN_BUILD)
  atomic_signal_fence(memory_order_release);   /* compiler barrier: earlier writes are emitted first */
  return --*x;
#else
  uint32_t v = *x - 1;
  __atomic_store_n(x, v, __ATOMIC_RELEASE);
  return v;
#endif
}
/* A 16-bit read that later reads may not pass (acquire), whose value is tested at once: call
 * mld_after_acquire_test() where the path that reads on continues. On x86-64 a load is never reordered with later
 * loads, so a plain read (folded into the test: one `cmp` with memory) and a compiler barrier after the test do;
 * elsewhere, and under ThreadSanitizer, an atomic acquire load. */
static inline uint16_t mld_peek_acquire_u16(const uint16_t *x) {
#if defined(__x86_64__) && !defined(MLD_TSAN_BUILD)
  return *x;
#else
  return __atomic_load_n(x, __ATOMIC_ACQUIRE);
#endif
}
static inline void mld_after_acquire_test(void) {
#if defined(__x86_64__) && !defined(MLD_TSAN_BUILD)
  atomic_signal_fence(memory_order_acquire);   /* compiler barrier: the later reads are emitted after the test */
#endif
}
/* A full barrier right after an atomic read-modify-write (a later load may not be satisfied before the RMW is
 * visible): on x86-64 every locked RMW is one already, so only the compiler is held back (ThreadSanitizer builds
 * too: it models no fences, and gcc refuses atomic_thread_fence there); elsewhere (aarch64: casl, ldsetl, swpal are
 * not full barriers) a seq_cst fence. */
static inline void mld_fence_after_rmw(void) {
#if defined(__x86_64__)
  atomic_signal_fence(memory_order_seq_cst);
#else
  atomic_thread_fence(memory_order_seq_cst);
#endif
}
/* A never-returning report reached by a jump from a fast path: a call there would make every caller align the stack
 * for it. MLD_COLD_ENTRY(entry, target) defines the entry (it aligns the stack and calls target(a, b));
 * MLD_COLD_JUMP(entry, target, a, b) jumps to it (elsewhere than x86-64: calls target). */
#if defined(__x86_64__)
#define MLD_COLD_JUMP(entry, target, a, b)                                                    \
  do {                                                                                        \
    __asm__ volatile("jmp " #entry : : "D"(a), "S"(b));                                       \
    __builtin_unreachable();                                                                  \
  } while (0)
#define MLD_COLD_ENTRY(entry, target)                                                         \
  __asm__(".text\n.globl " #entry "\n.hidden " #entry "\n.type " #entry ", @function\n" #entry \
          ":\n  andq $-16, %rsp\n  call " #target "\n  ud2\n.size " #entry ", . - " #entry "\n")
#else
#define MLD_COLD_JUMP(entry, target, a, b) target(a, b)
#define MLD_COLD_ENTRY(entry, target)
#endif

#endif
