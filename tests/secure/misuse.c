/* misuse.c — commits one kind of heap misuse (named on the command line) for the secure variant's tests. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void *shared;
static void *remote_free(void *arg) { (void)arg; free(shared); return NULL; }
/* remote_free_all: another thread frees remote_batch[0 .. remote_count). */
static void **remote_batch;
static int remote_count;
static void *remote_free_all(void *arg) {
  (void)arg;
  for (int i = 0; i < remote_count; i++) free(remote_batch[i]);
  return NULL;
}
static __thread void *volatile sink;   /* per thread: several threads call opaque at once (guard-race) */
static void *opaque(void *p);

/* A thread that frees `shared` and then waits, so that the block may still sit in its outbox while the main
 * thread frees it again; it exits (sending its outbox) only when told. */
static pthread_barrier_t freed, done;
static void *remote_free_and_wait(void *arg) {
  (void)arg;
  free(shared);
  pthread_barrier_wait(&freed);
  pthread_barrier_wait(&done);
  return NULL;
}
static void *racing_free(void *arg) {
  (void)arg;
  pthread_barrier_wait(&freed);
  free(shared);
  return NULL;
}
static void run_thread(void *(*fn)(void *)) {
  pthread_t t;
  pthread_create(&t, NULL, fn, NULL);
  pthread_join(t, NULL);
}

/* Prints "clean" when n is 0, else "WHAT n". */
static void print_clean_or(const char *what, int n) {
  if (n) printf("%s %d\n", what, n);
  else printf("clean\n");
}

/* Another thread frees blocks[0 .. n) and exits (sending its outbox). */
static void free_in_other_thread(void **blocks, int n) {
  remote_batch = blocks;
  remote_count = n;
  run_thread(remote_free_all);
}

/* Prints "twice" and exits 0 when one of n fresh allocations of `size` bytes is handed out twice (a misuse the
 * allocator let through), else returns. */
static void report_duplicates(size_t size, int n) {
  void *got[64];
  for (int i = 0; i < n && i < 64; i++) {
    got[i] = opaque(malloc(size));   /* opaque: a compiler may fold comparisons of two mallocs to false */
    for (int j = 0; j < i; j++)
      if (got[j] == got[i]) { printf("twice %p\n", got[i]); printf("not detected\n"); exit(0); }
  }
}

/* Like report_duplicates over n (up to 1 << 16) allocations, enough to exhaust a page's free list, so that its
 * owner collects the blocks other threads freed: a block handed out twice among them is found by sorting. */
static int cmp_ptr(const void *a, const void *b) {
  uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
  return x < y ? -1 : x > y;
}
static void report_duplicates_many(size_t size, int n) {
  static void *got[1 << 16];
  if (n > (1 << 16)) n = 1 << 16;
  for (int i = 0; i < n; i++) got[i] = opaque(malloc(size));
  qsort(got, (size_t)n, sizeof *got, cmp_ptr);
  for (int i = 1; i < n; i++)
    if (got[i] == got[i - 1]) { printf("twice %p\n", got[i]); printf("not detected\n"); exit(0); }
}

/* Keep the compiler from reasoning about the misuse (it would warn, or drop the code). */
static void *opaque(void *p) { sink = p; return sink; }
/* memset through a volatile pointer: the compiler cannot prove the stores dead before a free and drop them. */
static void *(*volatile opaque_memset)(void *, int, size_t) = memset;
/* The usable bytes written, then the one byte past them changed: a canary sees only a write that changes it, and a
 * fixed byte (0x41) equals the canary's first byte in 1 run of 256 ("not detected" then, with nothing missed: the
 * memory holds what it held). Read first through opaque, as a program's over-read would. */
static void overflow_one_byte(char *p) {
  size_t u = malloc_usable_size(p);
  volatile char *q = opaque(p);
  char past = q[u];
  opaque_memset(p, 0x41, u);
  q[u] = (char)~past;
}

/* Resident memory of this process in KiB (/proc/self/statm's second field, in pages); -1 if unreadable. */
static long resident_kib(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  long size, res = -1;
  if (f) {
    if (fscanf(f, "%ld %ld", &size, &res) != 2) res = -1;
    fclose(f);
  }
  return res < 0 ? -1 : res * (sysconf(_SC_PAGESIZE) / 1024);
}

/* Is the OS page starting at addr mapped with no access at all (a guard)? Reads /proc/self/maps. */
static int page_is_prot_none(uintptr_t addr) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) return -1;
  char line[512];
  int found = 0;
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    char perms[8];
    if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3) continue;
    if (addr >= lo && addr < hi) { found = !strncmp(perms, "---", 3) ? 1 : 2; break; }
  }
  fclose(f);
  return found;   /* 1: PROT_NONE, 2: accessible, 0: not mapped */
}

/* A linear overflow of 8 KiB past a 4000-byte block of a small page that ends in a guard page (found through
 * /proc/self/maps among 300 blocks; the fast variant has none: the overflow runs past the last block). */
static void slab_guard_overflow(void) {
  char *q = NULL;
  for (int i = 0; i < 300 && !q; i++) {
    char *b = malloc(4000);
    uintptr_t end = ((uintptr_t)b + malloc_usable_size(b) + 8 + 4095) & ~(uintptr_t)4095;
    if (page_is_prot_none(end) == 1 || page_is_prot_none(end + 4096) == 1) q = b;
    if (i == 299 && !q) q = b;
  }
  opaque_memset(q, 0x41, malloc_usable_size(q) + 8192);
}

/* slab-overflow: a child process writes 8 bytes at a time from the start of block `start` on, past its end, until
 * it faults; the SIGSEGV handler writes the distance from the block's start to the faulting address on `fd` and
 * exits. */
static volatile uintptr_t overflow_start;   /* volatile: read by the handler only (stores not dropped) */
static volatile int overflow_fd;
static void overflow_fault(int sig, siginfo_t *si, void *ctx) {
  (void)sig;
  (void)ctx;
  char buf[32], *e = buf + sizeof buf, *q = e;
  uintptr_t d = (uintptr_t)si->si_addr - overflow_start;   /* the write faults at or past the block's start */
  *--q = '\n';
  do *--q = (char)('0' + d % 10); while (d /= 10);
  if (write(overflow_fd, q, (size_t)(e - q)) < 0) _exit(4);
  _exit(3);
}

/* The distance, in bytes from the block's start, at which a linear overflow from `b` faults (run in a child);
 * -1 when the child did not report one. */
static long overflow_distance(char *b) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    overflow_fd = fds[1];
    overflow_start = (uintptr_t)b;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = overflow_fault;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGBUS, &sa, NULL);
    for (volatile uint64_t *w = (volatile uint64_t *)(void *)b;; w++) *w = 0x4141414141414141ull;
  }
  close(fds[1]);
  char buf[32] = { 0 };
  ssize_t n = pid > 0 ? read(fds[0], buf, sizeof buf - 1) : -1;
  close(fds[0]);
  int st = 0;
  if (pid > 0) waitpid(pid, &st, 0);
  if (n <= 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 3) return -1;
  return strtol(buf, NULL, 10);
}

/* slab-overflow SIZE COUNT: COUNT blocks of SIZE bytes; a linear overflow from the lowest block of each 64 KiB slot
 * they touch (the first block of each page among them: the farthest from the next guard page); prints "max D N":
 * the largest distance from a block's start to the fault over the N blocks tried (-1: one did not fault). */
static void slab_overflow(size_t size, int count) {
  static char *got[1 << 16];
  if (count > (1 << 16)) count = 1 << 16;
  for (int i = 0; i < count; i++) got[i] = opaque(malloc(size));
  qsort(got, (size_t)count, sizeof *got, cmp_ptr);
  long most = 0;
  int tried = 0;
  for (int i = 0; i < count; i++) {
    if (i && ((uintptr_t)got[i] >> 16) == ((uintptr_t)got[i - 1] >> 16)) continue;   /* not the lowest of its slot */
    long d = overflow_distance(got[i]);
    tried++;
    if (d < 0) { most = -1; break; }
    if (d > most) most = d;
  }
  printf("max %ld %d\n", most, tried);
}

/* guard-race SIZE: threads take fresh pages of SIZE-byte blocks at once, each page handed out possibly placing the
 * guard of a page after it that another thread takes at the same moment; every usable byte of every block is
 * written (a guard closed inside a block faults), then the blocks are freed and the thread exits (its pages go back
 * to the arena, reused by the next threads). One size per run. (The aborts once seen here, "invalid pointer" in
 * free, came from this program: `sink` was one global, so a thread could take another's block from it and both
 * freed it; it is per thread now.) */
static size_t guard_race_size;
static void *guard_race_thread(void *arg) {
  (void)arg;
  char *b[40];
  for (int i = 0; i < 40; i++) {
    b[i] = opaque(malloc(guard_race_size));
    if (b[i]) opaque_memset(b[i], 0x5a, malloc_usable_size(b[i]));
  }
  for (int i = 0; i < 40; i++) free(b[i]);
  return NULL;
}

static void guard_race(size_t size) {
  enum { THREADS = 10, ROUNDS = 30 };
  guard_race_size = size;
  for (int r = 0; r < ROUNDS; r++) {
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, guard_race_thread, NULL);
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
  }
  printf("ok\n");
}

/* A thread that takes pages of 4000-byte blocks, writes every byte, frees everything and exits. */
static void *fill_pages_and_exit(void *arg) {
  (void)arg;
  char *b[300];
  for (int i = 0; i < 300; i++) { b[i] = malloc(4000); opaque_memset(b[i], 0x5a, malloc_usable_size(b[i])); }
  for (int i = 0; i < 300; i++) free(b[i]);
  return NULL;
}


/* The option as Mallard reports it through mallard_ctl (looked up: the program does not link Mallard). */
static int reported_bool(const char *name) {
  int (*ctl)(const char *, void *, size_t *, void *, size_t) =
      (int (*)(const char *, void *, size_t *, void *, size_t))dlsym(RTLD_DEFAULT, "mallard_ctl");
  bool v = false;
  size_t len = sizeof v;
  if (!ctl || ctl(name, &v, &len, NULL, 0) != 0) return -1;
  return v;
}


/* mallard_ctl, looked up (the program does not link Mallard): 0 or an errno value. */
static int ctl_read(const char *name, void *out, size_t len) {
  int (*ctl)(const char *, void *, size_t *, void *, size_t) =
      (int (*)(const char *, void *, size_t *, void *, size_t))dlsym(RTLD_DEFAULT, "mallard_ctl");
  return ctl ? ctl(name, out, &len, NULL, 0) : -1;
}

/* What bytes [from, to) of p hold, read through a volatile pointer: "alloc" (all 0xa5, junk's allocation
 * pattern), "free" (all 0x5a), "zero", "mine" (all 0x11, what the program wrote) or "mixed". */
static const char *verdict(const void *p, size_t from, size_t to) {
  const volatile unsigned char *b = opaque((void *)p);
  unsigned char first = b[from];
  for (size_t i = from + 1; i < to; i++)
    if (b[i] != first) return "mixed";
  return first == 0xa5 ? "alloc" : first == 0x5a ? "free" : first == 0 ? "zero" : first == 0x11 ? "mine" : "mixed";
}

/* junk: one line per allocator path, "PATH VERDICT" (verdict above). Freed memory is read only where it stays
 * mapped and readable: small blocks (past their first 8 bytes, the free-list link; 16 for a remote free, whose
 * batch head holds two words in the fast variant), and large and huge blocks when read_big_freed (the fast
 * variant keeps them mapped; the secure variant with secure_noaccess_min above their size). */
/* A new thread's first allocation is of 0 bytes: it gets a block of 16 usable bytes or more, which junk fills too. */
static void *first_malloc0(void *arg) {
  (void)arg;
  char *q = opaque(malloc(0));
  printf("small-new-thread-malloc0 %s\n", verdict(q, 0, malloc_usable_size(q)));
  free(q);
  return NULL;
}

/* junk on one big path (large or huge): a new block, its freed contents (when readable), a calloc'd block. */
static void junk_big(const char *path, size_t n, bool read_freed) {
  char *q = opaque(malloc(n));
  printf("%s-new %s\n", path, verdict(q, 0, n));
  opaque_memset(q, 0x11, n);
  free(q);
  if (read_freed) printf("%s-freed %s\n", path, verdict(q, 0, n));
  q = opaque(calloc(1, n));
  printf("%s-calloc %s\n", path, verdict(q, 0, n));
  free(q);
}

/* junk across realloc growth from `from` bytes the program wrote to `to` bytes: the kept part, the new tail and, when
 * read_old and the block moved, the old copy past its link word. Returns the grown block. */
static char *junk_grow(const char *path, size_t from, size_t to, bool read_old) {
  char *o = opaque(malloc(from));
  opaque_memset(o, 0x11, from);
  char *q = opaque(realloc(o, to));
  printf("realloc-%s-kept %s\n", path, verdict(q, 0, from));
  printf("realloc-%s-tail %s\n", path, verdict(q, from, to));
  if (read_old && q != o) printf("realloc-%s-old %s\n", path, verdict(o, 8, from));
  return q;
}

static void junk_paths(bool read_big_freed) {
  run_thread(first_malloc0);
  char *q = opaque(malloc(100));
  printf("small-new %s\n", verdict(q, 0, 100));
  opaque_memset(q, 0x11, 100);
  free(q);
  printf("small-freed %s\n", verdict(q, 8, 100));
  q = opaque(calloc(1, 100));
  printf("small-calloc %s\n", verdict(q, 0, 100));
  free(q);
  q = opaque(malloc(200));
  opaque_memset(q, 0x11, 200);
  shared = q;
  run_thread(remote_free);
  printf("small-remote-freed %s\n", verdict(q, 16, 192));   /* the fast variant's batch head: 2 words */
  junk_big("large", 512u << 10, read_big_freed);
  junk_big("huge", 8u << 20, read_big_freed);
  /* realloc: the copied part is the program's, the growth tail is new memory, the old block (moved) is freed. */
  free(junk_grow("small", 40, 1000, true));
  char *o = junk_grow("large", 300u << 10, 900u << 10, false);
  /* Shrunk in place: what stays of the bytes given up reads as freed. */
  q = opaque(realloc(o, 400u << 10));
  printf("realloc-large-shrink %s\n", q == o ? verdict(q, 400u << 10, malloc_usable_size(q)) : "moved");
  free(q);
  free(junk_grow("huge", 5u << 20, 9u << 20, false));
}

int main(int argc, char **argv) {
  const char *m = argc > 1 ? argv[1] : "";
  char *p = malloc(40);
  memset(p, 1, 40);
  if (!strcmp(m, "none")) {
    free(p);
  } else if (!strcmp(m, "double-free")) {
    free(p);
    free(opaque(p));
  } else if (!strcmp(m, "interior-free")) {
    free((char *)opaque(p) + 16);
  } else if (!strcmp(m, "misaligned-free")) {
    free((char *)opaque(p) + 1);
  } else if (!strcmp(m, "stack-free")) {
    int x;
    free(opaque(&x));
  } else if (!strcmp(m, "foreign-free")) {
    static char buf[64];
    free(opaque(buf));
  } else if (!strcmp(m, "overflow")) {
    overflow_one_byte(p);   /* one byte past the usable size */
    free(p);
  } else if (!strcmp(m, "overflow-remote")) {
    /* One byte past the block, which another thread then frees: found when the owner collects it, before the
     * block can be handed out again (the owner allocates until its page has to take its remote frees back). */
    overflow_one_byte(p);
    shared = p;
    run_thread(remote_free);
    for (int i = 0; i < 1 << 16; i++) sink = malloc(40);
  } else if (!strcmp(m, "overflow-realloc")) {
    size_t u = malloc_usable_size(p);
    memset(opaque(p), 0x41, u + 8);
    p = realloc(p, 4000);
  } else if (!strcmp(m, "use-after-free")) {
    free(p);
    memset(opaque(p), 0x42, 8);      /* clobbers the encoded free-list link */
    sink = malloc(40);
    sink = malloc(40);
  } else if (!strcmp(m, "remote-double-free")) {
    shared = p;
    pthread_t t;
    pthread_create(&t, NULL, remote_free, NULL);
    pthread_join(t, NULL);
    pthread_create(&t, NULL, remote_free, NULL);
    pthread_join(t, NULL);
  } else if (!strcmp(m, "remote-then-owner")) {
    /* Another thread frees the block (it reaches the owner), then its owner frees it again. */
    shared = p;
    run_thread(remote_free);
    free(opaque(p));
    printf("past the misuse\n");   /* the secure variant reports at the second free, not later */
    fflush(stdout);
    report_duplicates(40, 64);
  } else if (!strcmp(m, "remote-pending-then-owner")) {
    /* The same while the remote free still waits in the freeing thread's outbox (the thread has not exited). */
    shared = p;
    pthread_barrier_init(&freed, NULL, 2);
    pthread_barrier_init(&done, NULL, 2);
    pthread_t t;
    pthread_create(&t, NULL, remote_free_and_wait, NULL);
    pthread_barrier_wait(&freed);
    free(opaque(p));
    printf("past the misuse\n");
    fflush(stdout);
    pthread_barrier_wait(&done);
    pthread_join(t, NULL);
    report_duplicates(40, 64);
  } else if (!strncmp(m, "forged-", 7)) {
    /* Double frees whose in-band mark (the canary word, which says which free came) is put back between the two
     * frees by a write after free, with the canary value the program read past the live block: the immediate
     * check passes, and the allocation bitmap must still keep the block from being handed out twice. */
    size_t u = malloc_usable_size(p);
    uint64_t canary;
    memcpy(&canary, (char *)opaque(p) + u, 8);
    const char *order = m + 7;
    shared = p;
    if (!strcmp(order, "remote-then-owner")) {
      run_thread(remote_free);
      memcpy((char *)opaque(p) + u, &canary, 8);
      free(opaque(p));
    } else if (!strcmp(order, "remote-then-remote")) {
      run_thread(remote_free);
      memcpy((char *)opaque(p) + u, &canary, 8);
      run_thread(remote_free);
    } else if (!strcmp(order, "owner-then-remote")) {
      free(opaque(p));
      memcpy((char *)opaque(p) + u, &canary, 8);
      run_thread(remote_free);
    }
    report_duplicates_many(40, 1 << 16);
  } else if (!strcmp(m, "owner-then-remote")) {
    free(p);
    shared = opaque(p);
    run_thread(remote_free);
    report_duplicates(40, 64);
  } else if (!strcmp(m, "racing-double-free")) {
    /* Two other threads free the block at the same moment, 200 times over: exactly one of each pair may win. */
    for (int round = 0; round < 200; round++) {
      shared = malloc(40);
      pthread_barrier_init(&freed, NULL, 2);
      pthread_t t[2];
      for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, racing_free, NULL);
      for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
      pthread_barrier_destroy(&freed);
    }
    report_duplicates(40, 64);
  } else if (!strcmp(m, "racing-owner-remote")) {
    /* The owner and another thread free the block at the same moment, 200 times over: both may pass their own
     * checks, and the block must still never be handed out twice. */
    for (int round = 0; round < 200; round++) {
      shared = malloc(40);
      pthread_barrier_init(&freed, NULL, 2);
      pthread_t t;
      pthread_create(&t, NULL, racing_free, NULL);
      pthread_barrier_wait(&freed);
      free(opaque(shared));
      pthread_join(t, NULL);
      pthread_barrier_destroy(&freed);
    }
    report_duplicates_many(40, 1 << 16);
  } else if (!strcmp(m, "self-loop")) {
    /* The attack of issue 16: with only the program's own freed pointers and no key, one 8-byte write after free
     * copies b's stored link (which leads to a) into a, so that a's link leads to a itself. */
    char *a = malloc(40), *b = malloc(40);
    free(a);
    free(b);
    memcpy(opaque(a), opaque(b), 8);
    report_duplicates(40, 8);
  } else if (!strcmp(m, "metadata-guard")) {
    volatile char *seg = (char *)((uintptr_t)p & ~(uintptr_t)((4u << 20) - 1));
    printf("%d\n", seg[124 * 1024]);  /* inside the guard between the segment's metadata and user data */
  } else if (!strcmp(m, "huge-guard")) {
    char *h = malloc(5u << 20);
    volatile char *end = h + malloc_usable_size(h);
    end[100] = 1;                     /* just past the huge block */
  } else if (!strcmp(m, "huge-guard-maps")) {
    /* Which mapping follows a huge block: prints "guard" (PROT_NONE), "open" (accessible) or "unmapped". */
    char *h = malloc(5u << 20);
    uintptr_t end = ((uintptr_t)h + malloc_usable_size(h) + 4095) & ~(uintptr_t)4095;
    int st = page_is_prot_none(end);
    printf("%s\n", st == 1 ? "guard" : st == 2 ? "open" : "unmapped");
    free(h);
    return 0;
  } else if (!strcmp(m, "layout")) {
    /* The addresses a fresh program gets: 64 small blocks of one class, then 8 blocks each in a new region. */
    void *small[64], *big[8];
    for (int i = 0; i < 64; i++) small[i] = malloc(48);
    for (int i = 0; i < 8; i++) big[i] = malloc(6u << 20);
    printf("small");
    for (int i = 0; i < 64; i++) printf(" %lx", (unsigned long)(uintptr_t)small[i]);
    printf("\nbig");
    for (int i = 0; i < 8; i++) printf(" %lx", (unsigned long)(uintptr_t)big[i]);
    printf("\n");
    return 0;
  } else if (!strcmp(m, "carve-order")) {
    /* Prints the address (hex) of each of 20000 blocks of 200 bytes in hand-out order, none freed: the order in
     * which fresh blocks are carved into a page's list (the secure variant shuffles each run of `shuffle` blocks
     * of every 16 KiB chunk). */
    for (int i = 0; i < 20000; i++) printf("%lx\n", (unsigned long)(uintptr_t)malloc(200));
    return 0;
  } else if (!strcmp(m, "reuse-or-extend")) {
    /* A page's first chunk of 8000-byte blocks (8 KiB blocks: a chunk is the 4-block minimum, the 64 KiB page holds
     * 7 or 8) is handed out whole; another thread frees two of them; the next malloc refills from the page. Prints
     * "recycled" when it returns one of the two, "fresh" when a block of the page not yet handed out, "other"
     * otherwise. The secure variant carves fresh blocks first at a coin toss (page.c mld_page_refill). */
    static void *b[4];
    for (int i = 0; i < 4; i++) b[i] = opaque(malloc(8000));
    uintptr_t page = (uintptr_t)b[0] & ~(uintptr_t)0xFFFF;
    for (int i = 1; i < 4; i++)
      if (((uintptr_t)b[i] & ~(uintptr_t)0xFFFF) != page) { printf("other (the chunk spans pages)\n"); return 0; }
    free_in_other_thread(b, 2);
    void *q = opaque(malloc(8000));
    if (q == b[0] || q == b[1]) printf("recycled\n");
    else if (((uintptr_t)q & ~(uintptr_t)0xFFFF) == page && q != b[2] && q != b[3]) printf("fresh\n");
    else printf("other %p\n", q);
    return 0;
  } else if (!strcmp(m, "fresh-words")) {
    /* Prints "clean" when the first word of every fresh block reads 0, else "nonzero N": what a program reading
     * uninitialised memory learns (in a secure build before issue 16: a list terminator was the key itself). */
    int nonzero = 0;
    for (int i = 0; i < 300; i++) {
      uint64_t *q = malloc(40);
      if (*(volatile uint64_t *)opaque(q)) nonzero++;
    }
    print_clean_or("nonzero", nonzero);
    return 0;
  } else if (!strcmp(m, "remote-words")) {
    /* Blocks freed by another thread come back to their owner by its collection. Prints "clean" when the second
     * word of every block handed out afterwards is 0 or what the program wrote there, else "hint N": N blocks hand
     * out a stored address (the secure variant once kept an encrypted address of a block further on a remote-free
     * chain there; remote frees now write nothing into the block). */
    enum { N = 256, AGAIN = 1200 };
    static void *blocks[N];
    for (int i = 0; i < N; i++) opaque_memset(blocks[i] = malloc(48), 0x11, 48);
    free_in_other_thread(blocks, N);
    int hint = 0;
    for (int i = 0; i < AGAIN; i++) {
      uint64_t *q = opaque(malloc(48));
      uint64_t w = ((volatile uint64_t *)q)[1];
      if (w != 0 && w != 0x1111111111111111ull) hint++;
    }
    print_clean_or("hint", hint);
    return 0;
  } else if (!strcmp(m, "remote-rounds")) {
    /* Rounds of blocks of several sizes (small pages and multi-slot pages) allocated here and freed by another
     * thread in shuffled order: each collection must clear every remote bit it takes (a bit left set makes the next
     * remote free of the block, handed out again, a false double free). Prints "ok". */
    enum { N = 192, ROUNDS = 12 };
    static void *blocks[N];
    static const size_t sizes[] = { 48, 1000, 16384, 32768 };   /* 16 and 32 KiB: words 64 KiB apart share a table entry */
    uint64_t x = 88172645463325252ull;
    for (int r = 0; r < ROUNDS; r++) {
      for (int i = 0; i < N; i++) blocks[i] = opaque(malloc(sizes[(i + r) % 4]));
      for (int i = N - 1; i > 0; i--) {   /* freed in an order unrelated to their addresses */
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        int j = (int)(x % (uint64_t)(i + 1));
        void *t = blocks[i]; blocks[i] = blocks[j]; blocks[j] = t;
      }
      free_in_other_thread(blocks, N);
    }
    printf("ok\n");
    return 0;
  } else if (!strcmp(m, "canary-key")) {
    /* Reads the 8 bytes past the usable size of 64 blocks (the secure variant's canaries) and prints "constant" when
     * canary ^ (address >> 4) is the same for all (a process-wide key readable by the program), else "varied". */
    uint64_t first = 0;
    int same = 0;
    for (int i = 0; i < 64; i++) {
      char *q = malloc(40);
      uint64_t c;
      memcpy(&c, (char *)opaque(q) + malloc_usable_size(q), 8);
      uint64_t k = c ^ ((uintptr_t)q >> 4);
      if (i == 0) first = k;
      else same += k == first;
    }
    printf("%s\n", same == 63 ? "constant" : "varied");
    return 0;
  } else if (!strcmp(m, "reuse")) {
    /* Prints how many of 100 malloc-after-free pairs got the block just freed back. */
    int again = 0;
    for (int i = 0; i < 100; i++) {
      void *a = opaque(malloc(40));
      free(a);
      void *b = opaque(malloc(40));
      again += (uintptr_t)a == (uintptr_t)b;
    }
    printf("%d\n", again);
    return 0;
  } else if (!strcmp(m, "slab-overflow") && argc > 3) {
    slab_overflow((size_t)strtoul(argv[2], NULL, 0), atoi(argv[3]));
    return 0;
  } else if (!strcmp(m, "huge-addresses")) {
    /* Huge blocks of 6-8 MiB allocated and freed in turn: each address printed. The secure variant maps segments,
     * and moves freed huge mappings (the huge cache), to random addresses in [2^40, 2^46). */
    for (int i = 0; i < 40; i++) {
      char *p = opaque(malloc((size_t)(6 + i % 3) << 20));
      if (!p) return 3;
      opaque_memset(p, 1, 4096);
      printf("%p\n", (void *)p);
      free(p);
    }
    return 0;
  } else if (!strcmp(m, "guard-race") && argc > 2) {
    guard_race((size_t)strtoul(argv[2], NULL, 0));
    return 0;
  } else if (!strcmp(m, "class-sizes")) {
    /* The size classes, as mallard_ctl reports them: one per line, until the first class it does not know. */
    char name[64];
    size_t size;
    for (unsigned c = 0; snprintf(name, sizeof name, "stats.classes.%u.size", c) > 0; c++) {
      if (ctl_read(name, &size, sizeof size) != 0) break;
      printf("%zu\n", size);
    }
    return 0;
  } else if (!strcmp(m, "class-use") && argc > 3) {
    /* class-use SIZE COUNT: COUNT blocks of SIZE bytes taken, written at both ends, freed, and taken again; prints
     * "ok". */
    static char *got[1 << 17];
    size_t size = (size_t)strtoul(argv[2], NULL, 0), n = (size_t)strtoul(argv[3], NULL, 0);
    if (!size || n > (1u << 17)) return 2;
    for (int round = 0; round < 2; round++) {
      for (size_t i = 0; i < n; i++) {
        got[i] = opaque(malloc(size));
        if (!got[i]) { printf("malloc(%zu) failed\n", size); return 1; }
        got[i][0] = 1;
        got[i][size - 1] = 2;
      }
      for (size_t i = 0; i < n; i++) free(got[i]);
    }
    printf("ok\n");
    return 0;
  } else if (!strcmp(m, "slab-guard")) {
    slab_guard_overflow();
  } else if (!strcmp(m, "slab-guard-reused")) {
    /* The same once a thread's pages went back to the free spans and came out again (their guards stay). */
    run_thread(fill_pages_and_exit);
    printf("filled\n");
    fflush(stdout);
    slab_guard_overflow();
  } else if (!strcmp(m, "large-reused-guard")) {
    /* 30 blocks of 1 MiB freed: all but the quarantine's 8 go back to the arena closed, and every free span that
     * can hold 1 MiB is one of them (or made of them). Then one written whole (the arena opened it) and
     * overflowed by 100 bytes (its guard slot was kept closed). */
    void *old[30];
    for (int i = 0; i < 30; i++) old[i] = opaque(malloc(1u << 20));
    for (int i = 0; i < 30; i++) free(old[i]);
    char *q = malloc(1u << 20);
    opaque_memset(q, 0x41, malloc_usable_size(q));
    printf("filled\n");
    fflush(stdout);
    opaque_memset(q, 0x41, malloc_usable_size(q) + 100);
  } else if (!strcmp(m, "large-guard")) {
    char *q = malloc(1u << 20);
    opaque_memset(q, 0x41, malloc_usable_size(q) + 100);   /* 100 bytes past a 1 MiB block */
  } else if (!strcmp(m, "large-realloc-guard")) {
    /* Large blocks resized (in place where the next span is free) keep their guard right after them. */
    char *q = malloc(400u << 10);
    q = realloc(q, 1u << 20);
    q = realloc(q, 1500u << 10);
    q = realloc(q, 300u << 10);
    opaque_memset(q, 0x41, malloc_usable_size(q) + 100);
  } else if (!strcmp(m, "huge-realloc-guard")) {
    /* Huge blocks resized inside their mapping (grown, then shrunk) keep the guard right after their end. */
    char *q = malloc(5u << 20);
    q = realloc(q, (11u << 20) / 2);   /* moves, with room to grow */
    q = realloc(q, 7u << 20);          /* grows inside the mapping */
    opaque_memset(q, 0x41, 7u << 20);
    q = realloc(q, 6u << 20);          /* shrinks inside it */
    opaque_memset(q, 0x41, malloc_usable_size(q) + 100);
  } else if (!strcmp(m, "huge-cache-guard")) {
    /* A 7 MiB block served from the huge cache by an 8 MiB mapping, then a 1,000,000-byte overflow past it. */
    free(opaque(malloc(8u << 20)));
    char *q = malloc(7u << 20);
    opaque_memset(q, 0x41, malloc_usable_size(q) + 1000000);
  } else if (!strcmp(m, "large-uaf-read") || !strcmp(m, "huge-uaf-read")) {
    size_t n = m[0] == 'l' ? 512u << 10 : 8u << 20;
    char *q = malloc(n);
    opaque_memset(q, 0x5a, n);
    free(q);
    printf("read %x\n", ((volatile unsigned char *)opaque(q))[100]);   /* after free: faults in the secure variant */
  } else if (!strcmp(m, "huge-uaf-after-reuse")) {
    /* An 8 MiB block freed, its memory handed out again from the huge cache and written, then the old pointer read:
     * the secure variant moved the freed mapping away (its old range is unmapped), so the read faults. */
    char *q = malloc(8u << 20);
    opaque_memset(q, 0x5a, 8u << 20);
    free(q);
    char *r = malloc(8u << 20);
    opaque_memset(r, 0x33, 8u << 20);
    printf("read %x (%s)\n", ((volatile unsigned char *)opaque(q))[100], (uintptr_t)opaque(r) == (uintptr_t)q ? "same address" : "elsewhere");
  } else if (!strcmp(m, "reuse-large")) {
    /* Prints how many of 20 malloc-after-free pairs of 512 KiB got the block just freed back. */
    int again = 0;
    for (int i = 0; i < 20; i++) {
      void *a = opaque(malloc(512u << 10));
      free(a);
      void *b = opaque(malloc(512u << 10));
      again += (uintptr_t)a == (uintptr_t)b;   /* through opaque(): a compiler may not fold it to false */
      free(b);
    }
    printf("%d\n", again);
    return 0;
  } else if (!strcmp(m, "quarantine-idle") || !strcmp(m, "quarantine-idle-1")) {
    /* Frees 8 (or 1) written 1 MiB large blocks (the test sets large_quarantine:8), then idles 1.5 s; prints the
     * resident KiB just after the frees and after the idle time: the purging thread should give quarantined blocks
     * back once they are older than dirty_decay_ms, as it gives back dirty spans (one block alone evicts nothing:
     * only the quarantine itself can wake the thread for it). */
    void *b[8];
    int n = strcmp(m, "quarantine-idle") ? 1 : 8;
    for (int i = 0; i < n; i++) opaque_memset(b[i] = malloc(1u << 20), 0x33, 1u << 20);
    for (int i = 0; i < n; i++) free(b[i]);
    long before = resident_kib();
    usleep(1500 * 1000);
    printf("%ld %ld\n", before, resident_kib());
    return 0;
  } else if (!strcmp(m, "fork-random")) {
    /* Two children of one parent each print a line: the address of a new huge block and the order of 32 blocks of
     * a size class the parent never used. Equal lines: the children share the parent's randomness. */
    fflush(stdout);
    for (int c = 0; c < 2; c++) {
      pid_t pid = fork();
      if (pid == 0) {
        printf("%p", malloc(6u << 20));
        for (int i = 0; i < 32; i++) printf(" %lx", (unsigned long)((uintptr_t)malloc(3000) & 0xfffff));
        printf("\n");
        fflush(stdout);
        _exit(0);
      }
      waitpid(pid, NULL, 0);
    }
    return 0;
  } else if (!strcmp(m, "zero-on-free-remote")) {
    /* zero_on_free and a block freed by another thread: prints "wiped" or "not wiped at N" as below. */
    char *q = malloc(200);
    opaque_memset(q, 0x5a, 200);
    shared = q;
    run_thread(remote_free);
    int bad = -1;
    for (int i = 16; i < 192 && bad < 0; i++)
      if (((volatile char *)q)[i] != 0) bad = i;
    if (bad >= 0) printf("not wiped at %d\n", bad);
    else printf("wiped\n");
    return 0;
  } else if (!strcmp(m, "zero-on-free")) {
    /* Prints "wiped" or "not wiped at N", then "reported R": what mallard_ctl says opt.zero_on_free is. */
    char *q = malloc(200);
    opaque_memset(q, 0x5a, 200);
    free(opaque(q));
    /* The block's bytes after the free-list link must be wiped (the link itself is the first 8). */
    int bad = -1;
    for (int i = 8; i < 192 && bad < 0; i++)
      if (((volatile char *)q)[i] != 0) bad = i;
    if (bad >= 0) printf("not wiped at %d\n", bad);
    else printf("wiped\n");
    printf("reported %d\n", reported_bool("opt.zero_on_free"));
    return 0;
  } else if (!strcmp(m, "junk") || !strcmp(m, "junk-live")) {
    junk_paths(m[4] == 0);   /* junk-live: freed large and huge blocks are not read (PROT_NONE in the secure variant) */
    return 0;
  } else if (!strcmp(m, "junk-prof")) {
    /* Sampling still works while junk sends every allocation to the slow path: samples taken of 4096 blocks. */
    for (int i = 0; i < 4096; i++) free(opaque(malloc(1000)));
    uint64_t samples = 0;
    ctl_read("prof.stats.samples", &samples, sizeof samples);
    printf("%llu\n", (unsigned long long)samples);
    return 0;
  } else if (!strcmp(m, "secure-opts")) {
    /* The secure options as mallard_ctl reports them: guard_slab_interval secure_noaccess_min large_quarantine
     * delayed_reuse junk shuffle. */
    unsigned g = 99, lq = 99, sh = 9999;
    size_t nm = 0;
    bool dr = false;
    const char *junk = "?";
    ctl_read("opt.guard_slab_interval", &g, sizeof g);
    ctl_read("opt.secure_noaccess_min", &nm, sizeof nm);
    ctl_read("opt.large_quarantine", &lq, sizeof lq);
    ctl_read("opt.delayed_reuse", &dr, sizeof dr);
    ctl_read("opt.junk", &junk, sizeof junk);
    ctl_read("opt.shuffle", &sh, sizeof sh);
    printf("%u %zu %u %d %s %u\n", g, nm, lq, (int)dr, junk, sh);
    return 0;
  } else {
    fprintf(stderr, "unknown misuse %s\n", m);
    return 2;
  }
  printf("not detected\n");
  return 0;
}
