/* test_keep_empty.c — an emptied medium page and its heap (heap.c keep_empty): a class used now and then gives its
 * empty page back each time (`rare`), a malloc/free loop over the size keeps its page after a few turns and stays on
 * the fast path (`loop`). Counted with stats.classes.<c>.npages (pages taken) and .curpages (pages held), in a thread
 * of its own: its heap holds no other page of the class. */
#include "mtest.h"
#include <pthread.h>

enum { SIZE = 100000, LOOPS = 2000 };   /* SIZE: a medium class whose pages are at least two 64 KiB slots */
static unsigned cls;

static uint64_t cls_stat(const char *what) { return mt_class_stat(cls, what); }

/* Fewer empties than a loop makes: every one gives the page back. */
static void *rare(void *arg) {
  (void)arg;
  for (int i = 0; i < 5; i++) {
    void *p = M_malloc(SIZE);
    REQUIRE(p, "malloc(%d)", SIZE);
    mt_fill(p, SIZE, (uint64_t)i);
    uint64_t held = cls_stat("curpages");
    M_free(mt_hide(p));
    CHECK(cls_stat("curpages") == held - 1, "free %d of the class's only block: %llu pages held, %llu expected (the "
          "empty page stayed with the heap)", i, (unsigned long long)cls_stat("curpages"),
          (unsigned long long)(held - 1));
  }
  return NULL;
}

/* A malloc/free loop: after the first few turns its page stays, so pages are taken a few times, not once a turn. */
static void *loop(void *arg) {
  (void)arg;
  uint64_t taken = cls_stat("npages"), held = cls_stat("curpages");
  for (int i = 0; i < LOOPS; i++) {
    char *p = M_malloc(SIZE);
    REQUIRE(p, "malloc(%d)", SIZE);
    p[0] = (char)i;
    p[SIZE - 1] = (char)i;
    M_free(mt_hide(p));
  }
  uint64_t more = cls_stat("npages") - taken;
  CHECK(more <= LOOPS / 20, "%llu pages taken in %d malloc/free turns (the loop left the fast path: its empty page "
        "was given back each turn)", (unsigned long long)more, LOOPS);
  CHECK(cls_stat("curpages") == held + 1, "%llu pages held after the loop, %llu expected (its page kept)",
        (unsigned long long)cls_stat("curpages"), (unsigned long long)(held + 1));
  return NULL;
}

int main(int argc, char **argv) {
  REQUIRE(argc == 2, "usage: %s rare|loop", argv[0]);
  cls = mt_class_of(SIZE);
  void *(*fn)(void *) = !strcmp(argv[1], "rare") ? rare : !strcmp(argv[1], "loop") ? loop : NULL;
  REQUIRE(fn, "unknown case %s", argv[1]);
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, fn, NULL) == 0, "pthread_create");
  pthread_join(t, NULL);
  return mt_result(argv[1]);
}
