/* platform/os.c — the OS calls: aligned mappings, purging, remapping, huge-page advice, mapping names, clocks, CPU count and the test builds' race delay. */
#define _GNU_SOURCE
#include "platform/platform.h"
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/auxv.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

_Atomic(uint64_t) mld_mapped_bytes;
_Atomic(size_t) mld_os_page_v;
static _Atomic(size_t) kernel_page;        /* the kernel's own page: mmap's alignment (<= mld_os_page_v) */

size_t mld_os_page_init(void) {
  size_t k = (size_t)getauxval(AT_PAGESZ);
  if (!k) {
    long s = sysconf(_SC_PAGESIZE);
    k = s > 0 ? (size_t)s : MLD_OS_PAGE_MIN;
  }
  size_t p = k;
#ifdef MALLARD_TEST_PAGE_SIZE
  if ((size_t)MALLARD_TEST_PAGE_SIZE > p) p = MALLARD_TEST_PAGE_SIZE;   /* a larger page on this kernel: tests only */
#endif
  if (p < MLD_OS_PAGE_MIN || p > MLD_OS_PAGE_MAX || (p & (p - 1)))
    mld_fatal("mallard: a page size of %zu bytes is not supported (4 KiB to 64 KiB, a power of two)\n", p);
  atomic_store_explicit(&kernel_page, k, memory_order_relaxed);
  atomic_store_explicit(&mld_os_page_v, p, memory_order_relaxed);   /* every thread computes the same values */
  return p;
}
static _Atomic(uintptr_t) next_hint;       /* where the next aligned mapping is likely to fit (mappings grow down) */

static void *map_raw(void *hint, size_t size, int extra_flags) {
  void *p = mmap(hint, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | extra_flags, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

static void *map_aligned(size_t size, size_t align, uintptr_t hint);

/* size bytes at an `align`ed address (align > the kernel's page): mapped with the slack mmap's own alignment leaves,
 * then trimmed at both ends. NULL: no memory, or size + align wraps. */
static uint8_t *map_trimmed(size_t size, size_t align, int prot, int flags) {
  if (size + align < size) return NULL;
  size_t over = size + align - atomic_load_explicit(&kernel_page, memory_order_relaxed);   /* mmap's own alignment */
  uint8_t *raw = mmap(NULL, over, prot, flags, -1, 0);
  if (raw == MAP_FAILED) return NULL;
  uint8_t *aligned = (uint8_t *)(((uintptr_t)raw + align - 1) & ~(uintptr_t)(align - 1));
  if (aligned > raw) munmap(raw, (size_t)(aligned - raw));
  size_t tail = (size_t)((raw + over) - (aligned + size));
  if (tail) munmap(aligned + size, tail);
  return aligned;
}

#ifdef MALLARD_TEST_PAGE_SIZE
/* Test builds: every range the allocator protects, purges or unmaps is whole pages of the page in force. A 4 KiB
 * kernel (or qemu, even with -p) accepts 4 KiB-aligned ranges that a 16 or 64 KiB kernel refuses with EINVAL. */
static void check_pages(const char *what, const void *p, size_t size) {
  size_t m = mld_os_page() - 1;
  if (((uintptr_t)p & m) || (size & m))
    mld_fatal("mallard: %s(%p, %zu) is not whole pages of %zu bytes\n", what, p, size, m + 1);
}
#else
#define check_pages(what, p, size) ((void)0)
#endif

/* Every mapping lies below 2^MLD_ADDR_BITS, where the ownership map covers it: one the kernel places higher (it
 * does so only when asked, with a hint above 2^48 on aarch64 or 2^47 on x86-64) is given back, a clean failure
 * instead of blocks every free would take for foreign. */
void *mld_os_map_aligned(size_t size, size_t align, uintptr_t hint) {
  void *p = map_aligned(size, align, hint);
  if (p && ((uintptr_t)p >> MLD_ADDR_BITS || size > ((uintptr_t)1 << MLD_ADDR_BITS) - (uintptr_t)p)) {
    mld_os_unmap(p, size);
    return NULL;
  }
  return p;
}

static void *map_aligned(size_t size, size_t align, uintptr_t hint) {
  size_t page = mld_os_page();   /* sets kernel_page too */
  if (align < page) align = page;   /* a test build's page may be larger than the kernel's: align to it */
  if (align <= atomic_load_explicit(&kernel_page, memory_order_relaxed)) {
    void *p = map_raw(NULL, size, 0);
    if (p) atomic_fetch_add(&mld_mapped_bytes, size);
    return p;
  }
  /* First try the caller's hint (the secure variant's random segment addresses), else right below the previous
   * aligned mapping: usually free, and saves the trim. */
  if (!hint) hint = atomic_load_explicit(&next_hint, memory_order_relaxed);
  if (hint > size + align) {
    uintptr_t want = (hint - size) & ~(uintptr_t)(align - 1);
    void *p = map_raw((void *)want, size, MAP_FIXED_NOREPLACE);
    if (p == (void *)want) {
#ifndef MALLARD_SECURE
      atomic_store_explicit(&next_hint, want, memory_order_relaxed);
#endif
      atomic_fetch_add(&mld_mapped_bytes, size);
      return p;
    }
    if (p) munmap(p, size);   /* old kernels ignore the flag and may place it elsewhere */
  }
  uint8_t *aligned = map_trimmed(size, align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE);
  if (!aligned) return NULL;
  atomic_store_explicit(&next_hint, (uintptr_t)aligned, memory_order_relaxed);
  atomic_fetch_add(&mld_mapped_bytes, size);
  return aligned;
}

void mld_os_unmap(void *p, size_t size) {
  if (!p || !size) return;
  check_pages("munmap", p, 0);   /* the address only: a mapping's own length is fine */
  munmap(p, size);
  atomic_fetch_sub(&mld_mapped_bytes, size);
}

bool mld_os_purge(void *p, size_t size) {
  check_pages("madvise", p, size);
  /* MADV_DONTNEED: RSS drops at once and the pages read back as zero. On failure nothing is known to be zero. */
  return madvise(p, size, MADV_DONTNEED) == 0;
}

/* Huge-page advice for a new mapping (the core derives it from the thp option): asked for, refused, or left alone. */
void mld_os_thp(void *p, size_t size, int advice) {
  if (advice > 0) madvise(p, size, MADV_HUGEPAGE);
  else if (advice < 0) madvise(p, size, MADV_NOHUGEPAGE);
}

/* Move a mapping (one VMA) to a new `align`ed range of new_size bytes without copying: mremap carries its pages
 * and, where both ranges cover whole page-table pages, the tables themselves. The old range is left unmapped. */
void *mld_os_move(void *old, size_t old_size, size_t new_size, size_t align, uintptr_t hint) {
  void *dst = mld_os_map_aligned(new_size, align, hint);
  if (!dst) return NULL;
  void *p = mremap(old, old_size, new_size, MREMAP_MAYMOVE | MREMAP_FIXED, dst);
  if (p == MAP_FAILED) { mld_os_unmap(dst, new_size); return NULL; }
  atomic_fetch_sub(&mld_mapped_bytes, old_size);   /* dst's bytes were counted by map_aligned */
  return p;
}

/* Grow or shrink a mapping where it is; NULL when the kernel cannot (the caller may move it: mld_os_move). */
void *mld_os_resize(void *old, size_t old_size, size_t new_size) {
  void *p = mremap(old, old_size, new_size, 0);
  if (p == MAP_FAILED) return NULL;
  if (new_size > old_size) atomic_fetch_add(&mld_mapped_bytes, new_size - old_size);
  else atomic_fetch_sub(&mld_mapped_bytes, old_size - new_size);
  return p;
}

/* Name an anonymous mapping (Linux 5.17+ with CONFIG_ANON_VMA_NAME) so that /proc/PID/maps and `mallard vmem`
 * show it as Mallard's; silently nothing on other kernels. */
void mld_os_name(void *p, size_t size, const char *name) {
  static _Atomic(int) unsupported;
  if (atomic_load_explicit(&unsupported, memory_order_relaxed)) return;
  if (prctl(0x53564d41 /* PR_SET_VMA */, 0 /* PR_SET_VMA_ANON_NAME */, (unsigned long)p, size, (unsigned long)name) != 0)
    atomic_store_explicit(&unsupported, 1, memory_order_relaxed);
}


bool mld_os_init(void) {
  mld_os_barrier_register();
  return true;
}

#ifdef MALLARD_RACE_DELAY
/* Test builds: pause 0..~50 us (sometimes just yield) so that another thread runs inside the window. */
void mld_race_delay(void) {
  static _Atomic(uint64_t) seed = 0x9E3779B97F4A7C15ull;
  uint64_t x = atomic_fetch_add_explicit(&seed, 0x9E3779B97F4A7C15ull, memory_order_relaxed);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  if (x & 1) { sched_yield(); return; }
  struct timespec ts = { 0, (long)((x >> 8) % 50000) };
  nanosleep(&ts, NULL);
}
void mld_race_delay_sometimes(void) {
  static _Atomic(unsigned) period;   /* MALLARD_RACE_FREE_PERIOD (a test that needs every call paused sets 1); 64 */
  static __thread unsigned calls;
  unsigned p = atomic_load_explicit(&period, memory_order_relaxed);
  if (!p) {
    const char *e = getenv("MALLARD_RACE_FREE_PERIOD");   /* getenv allocates nothing */
    p = e && atoi(e) > 0 ? (unsigned)atoi(e) : 64;
    atomic_store_explicit(&period, p, memory_order_relaxed);
  }
  if (++calls % p == 0) mld_race_delay();
}
#endif

/* membarrier(2)'s commands (linux/membarrier.h, not in every libc's include path: musl's). */
#define MEMBARRIER_PRIVATE_EXPEDITED (1 << 3)
#define MEMBARRIER_REGISTER_PRIVATE_EXPEDITED (1 << 4)
static _Atomic(int) barrier_registered;   /* 0: not yet, 1: done, -1: refused (never asked again) */

static int barrier_register(void) {
#ifdef SYS_membarrier
  int r = syscall(SYS_membarrier, MEMBARRIER_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0 ? 1 : -1;
#else
  int r = -1;
#endif
  atomic_store_explicit(&barrier_registered, r, memory_order_release);
  return r;
}

/* The registration costs the kernel an RCU grace period when the process runs several threads (~9 ms here, in the
 * thread whose refill first took an idle owner's pages: mstress's worker, every process once) and nothing while it
 * runs one: done at initialisation, and again in a fork child (kernel 6.18 lets the child inherit it; a kernel that
 * does not would otherwise charge the child's first take). */
void mld_os_barrier_register(void) {
  int e = errno;   /* a refusal (ENOSYS, EINVAL) is no error of the program's */
  barrier_register();
  errno = e;
}

bool mld_os_barrier_all(void) {
#ifdef SYS_membarrier
  for (int tries = 0; tries < 2; tries++) {
    int r = atomic_load_explicit(&barrier_registered, memory_order_acquire);
    if (r < 0) return false;
    if (r == 0 && barrier_register() < 0) return false;
    if (syscall(SYS_membarrier, MEMBARRIER_PRIVATE_EXPEDITED, 0, 0) == 0) return true;
    if (errno != EPERM) return false;
    /* EPERM: not registered for this address space (a fork child on a kernel that does not inherit it). */
    atomic_store_explicit(&barrier_registered, 0, memory_order_release);
  }
#endif
  return false;
}

uint64_t mld_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

size_t mld_ncpus(void) { return mld_ncpus_of(0); }

/* The CPUs process pid (0: this one) may run on; all online CPUs when its affinity cannot be read. */
size_t mld_ncpus_of(int pid) {
  cpu_set_t set;
  if (sched_getaffinity(pid, sizeof set, &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return (size_t)n;
  }
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (size_t)n : 1;
}

uint64_t mld_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t mld_realtime_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- plain mappings: not counted in mld_mapped_bytes (their owners count them) ---- */
void *mld_os_map_plain(size_t size, bool accessible) {
  int prot = accessible ? PROT_READ | PROT_WRITE : PROT_NONE;
  int flags = MAP_PRIVATE | MAP_ANONYMOUS | (accessible ? 0 : MAP_NORESERVE);
#ifdef MALLARD_TEST_PAGE_SIZE
  /* A test build's page may be larger than the kernel's: start on one, as the kernel of that page size would. */
  size_t page = mld_os_page();
  if (page > atomic_load_explicit(&kernel_page, memory_order_relaxed)) return map_trimmed(size, page, prot, flags);
#endif
  void *p = mmap(NULL, size, prot, flags, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

void mld_os_unmap_plain(void *p, size_t size) {
  if (p && size) check_pages("munmap", p, 0);   /* the address only: a mapping's own length is fine */
  if (p && size) munmap(p, size);
}

void *mld_os_remap_plain(void *p, size_t old_size, size_t new_size) {
#ifdef MALLARD_TEST_PAGE_SIZE
  if (mld_os_page() > atomic_load_explicit(&kernel_page, memory_order_relaxed)) {   /* mremap may land off the page */
    void *q = mld_os_map_plain(new_size, true);   /* plain mappings that move are the accessible tables */
    if (!q) return NULL;
    memcpy(q, p, old_size < new_size ? old_size : new_size);
    mld_os_unmap_plain(p, old_size);
    return q;
  }
#endif
  void *q = mremap(p, old_size, new_size, MREMAP_MAYMOVE);
  return q == MAP_FAILED ? NULL : q;
}

bool mld_os_protect(void *p, size_t size, bool accessible) {
  check_pages("mprotect", p, size);
  return mprotect(p, size, accessible ? PROT_READ | PROT_WRITE : PROT_NONE) == 0;
}

/* ---- threads: the purging thread and the profiler's dump thread ---- */
static void *thread_boot(void *arg) {
  mld_thread_boot_t *b = arg;
  atomic_store_explicit(&b->started, 1, memory_order_release);
  return b->fn(NULL);
}

/* The creator does not wait for the new thread to run: on a busy machine that took ~1.5 ms (mstress: a new thread
 * waiting behind its creator's core), every process once. Whoever forks waits instead (mld_thread_wait_started). */
int mld_thread_start(pthread_t *t, mld_thread_boot_t *boot, size_t stack_size) {
  pthread_attr_t attr;
  sigset_t all, old;
  atomic_store_explicit(&boot->started, 0, memory_order_relaxed);
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);   /* inherited by the new thread: every signal blocked from its start */
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  if (stack_size) pthread_attr_setstacksize(&attr, stack_size);
  int rc = pthread_create(t, &attr, thread_boot, boot);
  pthread_attr_destroy(&attr);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  return rc;
}

void mld_thread_wait_started(mld_thread_boot_t *boot) {
  for (unsigned i = 0; !atomic_load_explicit(&boot->started, memory_order_acquire); i++) {
    if (i < 64) sched_yield();
    else nanosleep(&(struct timespec){0, 50000}, NULL);   /* not scheduled yet (one CPU, a busy machine) */
  }
}

/* ---- randomness and thread ids ---- */
bool mld_os_random(void *buf, size_t len) { return getrandom(buf, len, GRND_NONBLOCK) == (ssize_t)len; }
const uint8_t *mld_os_exec_random(void) { return (const uint8_t *)getauxval(AT_RANDOM); }
uint32_t mld_os_tid(void) { return (uint32_t)syscall(SYS_gettid); }

void mld_deadline_after_ms(struct timespec *ts, uint64_t wait_ms) {
  clock_gettime(CLOCK_MONOTONIC, ts);
  ts->tv_sec += (time_t)(wait_ms / 1000);
  ts->tv_nsec += (long)(wait_ms % 1000) * 1000000L;
  if (ts->tv_nsec >= 1000000000L) { ts->tv_sec++; ts->tv_nsec -= 1000000000L; }
}

/* ---- other processes (the live-statistics reader) ---- */
long mld_os_read_process(int pid, const struct iovec *local, const struct iovec *remote, unsigned long n) {
  return syscall(SYS_process_vm_readv, pid, local, n, remote, n, 0UL);
}
long mld_os_getdents(int fd, void *buf, size_t len) { return syscall(SYS_getdents64, fd, buf, len); }
