/* collect_checks.c — white-box checks of the secure variant's bookkeeping: a block its page's holder takes back
 * from the remote bitmap must be (live, remote) = (1,1); a remote bit that is not (a free of a block already free,
 * a forged bit inside a block) is reported, not collected; a page released empty must have every bit clear, a
 * stray one is reported; collected blocks go back from a random one; a free-list link that decodes to a block start
 * of the page not carved yet is reported, not handed out. Run with guard_sample:0 (CMakeLists.txt):
 * every block on a small page. */
#define _GNU_SOURCE
#include "core/core.h"
#include "core/secure.h"
#include <mallard.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

enum { CONTROL, INTERIOR_BIT, NOT_LIVE, STRAY_LIVE_SMALL, STRAY_REMOTE_MEDIUM, UNCARVED_LINK };

/* In the child: one block of `size` bytes on a fresh page; the last carved block other than it gets a stray bit
 * (live or remote: a bookkeeping error, no free makes it), then the block is freed and the page released. `warm`: a
 * block of the class is taken first and kept, so that b is on a page of the class's size, not on the heap's first
 * page of the class, which holds a single medium block (heap.c new_page_slots). */
static void stray_bit(size_t size, bool remote, bool warm) {
  if (warm) (void)mallard_malloc(size);
  uint8_t *b = mallard_malloc(size);
  page_t *pg = page_of(segment_of(b), b);
  uint8_t *last = page_start(pg) + (size_t)(pg->capacity - 1) * pg->block_size;
  if (last == b) last -= pg->block_size;
  uint64_t *w = bm_word(last);
  if (remote) w = bm_remote_word(w);
  __atomic_fetch_or(w, (uint64_t)1 << (bm_bit_index(last) & 63), __ATOMIC_RELAXED);
  mallard_free(b);
  mallard_ctl("thread.tcache.flush", NULL, NULL, NULL, 0);   /* the empty page leaves, kept or not */
  _exit(0);
}

/* In the child: the page's head gets a link, made with the page's own key, to the first block start past the carved
 * ones. Its bitmap bits are clear and its address is a block start of the page: only the bound of the carved bytes
 * (secure.h blk_next) stops the next malloc from handing it out. */
static void uncarved_link(void) {
  block_t *b = mallard_malloc(48);   /* a fresh page of 64-byte blocks (48 and the canary): 256 carved of 1,024 */
  page_t *pg = page_of(segment_of(b), b);
  if (!pg->free || pg->capacity >= pg->reserved) _exit(3);   /* not the layout the case needs */
  block_t *past = (block_t *)(page_start(pg) + (size_t)pg->capacity * pg->block_size);
  blk_set_next(pg, pg->free, past);
  void *head = mallard_malloc(48);   /* the head: its link decodes to `past` */
  void *next = mallard_malloc(48);
  printf("handed out %p then %p (past the carved blocks: %p)\n", head, next, (void *)past);
  _exit(0);
}

/* In the child: a block of a live page freed as another thread frees it (its remote bit, published), in one of
 * three states, then collected by its owner. */
static void child(int which) {
  if (which == STRAY_LIVE_SMALL) stray_bit(3000, false, false);   /* 3 KiB blocks: 5 carved, the last on word 12 */
  if (which == STRAY_REMOTE_MEDIUM) stray_bit(200000, true, true);  /* a 1 MiB page of 4 blocks over 200 KiB */
  if (which == UNCARVED_LINK) uncarved_link();
  void *keep = mallard_malloc(40);   /* the page stays in use whatever happens to b */
  block_t *b = mallard_malloc(48);
  page_t *pg = page_of(segment_of(b), b);
  if (which == NOT_LIVE) mallard_free(b);   /* the owner's free first: live bit cleared */
  if (which == INTERIOR_BIT) {
    /* a bit 16 bytes into the block (no free sets one there: remote frees check block starts), published in the
     * page's summary as a remote free would */
    uint8_t *in = (uint8_t *)b + 16;
    __atomic_fetch_or(bm_remote_word(bm_word(in)), (uint64_t)1 << (bm_bit_index(in) & 63), __ATOMIC_RELAXED);
    atomic_fetch_or(remote_summary(pg) + remote_summary_index(pg, in), remote_summary_bit(pg, in));
  } else {
    mld_remote_free_secure(&mld_heap_empty, pg, b);   /* what another thread's free does (published at once) */
  }
  mld_page_collect(pg);
  (void)keep;
  _exit(0);
}

/* Runs one case in a child; returns its wait status (-1: no child) and its stderr in err. */
static int run(int which, char *err, size_t len) {
  int fd[2];
  if (pipe(fd)) return -1;
  pid_t pid = fork();
  if (pid < 0) {   /* no child: a status no case accepts */
    close(fd[0]);
    close(fd[1]);
    err[0] = 0;
    return -1;
  }
  if (pid == 0) {
    dup2(fd[1], 2);
    close(fd[0]);
    child(which);
  }
  close(fd[1]);
  ssize_t n, got = 0;
  while ((n = read(fd[0], err + got, len - 1 - (size_t)got)) > 0) got += n;
  err[got] = 0;
  close(fd[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  return st;
}

static int cmp_ptr(const void *a, const void *b) {
  uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
  return x < y ? -1 : x > y;
}

/* Blocks freed by another thread go back on the free list in address order from a random one (page.c
 * push_rotated): over 32 collections of 8 blocks of one page, the first block handed out afterwards is the lowest
 * of the 8 about one time in 8, not every time. Returns how many of the 32 it was the lowest (-1: not measurable). */
static int lowest_first(void) {
  int lowest = 0, rounds = 0;
  for (int t = 0; t < 200 && rounds < 32; t++) {
    void *b[8];
    for (int i = 0; i < 8; i++) b[i] = mallard_malloc(48);
    page_t *pg = page_of(segment_of(b[0]), b[0]);
    bool one_page = true;
    for (int i = 1; i < 8; i++) one_page &= page_of(segment_of(b[i]), b[i]) == pg;
    if (one_page) {
      qsort(b, 8, sizeof b[0], cmp_ptr);
      for (int i = 0; i < 8; i++) mld_remote_free_secure(&mld_heap_empty, pg, b[i]);   /* published at once */
      mld_page_collect_remote(pg);
      lowest += pg->free == b[0];
      rounds++;
      for (int i = 0; i < 8; i++) b[i] = mallard_malloc(48);   /* the eight, back from the list */
    }
    for (int i = 0; i < 8; i++) mallard_free(b[i]);
  }
  return rounds == 32 ? lowest : -1;
}

int main(void) {
  char err[4096];
  int fails = 0;
  int st = run(CONTROL, err, sizeof err);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) { fprintf(stderr, "control: status %#x, stderr: %s\n", st, err); fails++; }
  static const struct { int which; const char *msg; } bad[] = {
    { INTERIOR_BIT, "double free or invalid free of" },
    { NOT_LIVE, "double free or invalid free of" },
    { STRAY_LIVE_SMALL, "live block in a page being released" },
    { STRAY_REMOTE_MEDIUM, "live block in a page being released" },
    { UNCARVED_LINK, "free list corrupted (use after free?): bad link in the block at" },
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    st = run(bad[i].which, err, sizeof err);
    if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGABRT || !strstr(err, bad[i].msg)) {
      fprintf(stderr, "case %d: status %#x, expected SIGABRT and \"%s\", stderr: %s\n", bad[i].which, st, bad[i].msg, err);
      fails++;
    }
  }
  int low = lowest_first();
  if (low < 0 || low == 32) { fprintf(stderr, "collected blocks: the lowest came first in %d of 32 collections\n", low); fails++; }
  if (!fails) printf("collect checks: ok\n");
  return fails != 0;
}
