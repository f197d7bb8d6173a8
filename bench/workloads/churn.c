/* Small-object churn in one thread: random sizes 8-512 B freed in LIFO, FIFO and random order, and a linked list built and torn down. */
#include "common.h"

struct obj {
  void *p;
  size_t n;
  uint64_t tag;
};

/* A list node carries its own pattern after the header; the tail of the node is checked before free. */
struct node {
  struct node *next;
  size_t n;        /* total bytes of the node */
  uint64_t tag;
};

static void fill_batch(struct obj *a, long count, uint64_t *rng) {
  for (long i = 0; i < count; i++) {
    a[i].n = rng_range(rng, 8, 512);
    a[i].tag = rng_next(rng);
    a[i].p = xmalloc(a[i].n);
    pat_fill(a[i].p, a[i].n, a[i].tag);
  }
}

static void release(struct obj *o) {
  pat_check(o->p, o->n, o->tag, "churn");
  free(o->p);
}

static double phase_order(const char *order, struct obj *a, long count, long rounds, uint64_t *rng) {
  double t0 = now_s();
  for (long r = 0; r < rounds; r++) {
    fill_batch(a, count, rng);
    if (strcmp(order, "lifo") == 0) {
      for (long i = count - 1; i >= 0; i--) release(&a[i]);
    } else if (strcmp(order, "fifo") == 0) {
      for (long i = 0; i < count; i++) release(&a[i]);
    } else {
      /* Fisher-Yates shuffle, then free in that order. */
      for (long i = count - 1; i > 0; i--) {
        long j = (long)(rng_next(rng) % (uint64_t)(i + 1));
        struct obj t = a[i];
        a[i] = a[j];
        a[j] = t;
      }
      for (long i = 0; i < count; i++) release(&a[i]);
    }
  }
  return now_s() - t0;
}

static double phase_list(long count, long rounds, uint64_t *rng) {
  double t0 = now_s();
  for (long r = 0; r < rounds; r++) {
    struct node *head = NULL;
    for (long i = 0; i < count; i++) {
      size_t n = rng_range(rng, sizeof(struct node), 512);
      struct node *nd = xmalloc(n);
      nd->next = head;
      nd->n = n;
      nd->tag = rng_next(rng);
      pat_fill((char *)nd + sizeof *nd, n - sizeof *nd, nd->tag);
      head = nd;
    }
    /* Teardown walks the list in link order, as a destructor would. */
    while (head) {
      struct node *next = head->next;
      pat_check((char *)head + sizeof *head, head->n - sizeof *head, head->tag, "churn-list");
      free(head);
      head = next;
    }
  }
  return now_s() - t0;
}

int main(int argc, char **argv) {
  struct bench_opts o = {.threads = 1, .iters = 50, .size = 20000, .seed = 1, .mode = "all"};
  bench_parse(argc, argv, &o, "churn: -n rounds, -s objects per round, -m lifo|fifo|random|list|all (threads ignored)");
  const char *all[] = {"lifo", "fifo", "random", "list"};
  double t[4] = {0, 0, 0, 0};
  long count = o.size > 0 ? o.size : 1;
  struct obj *a = xmalloc((size_t)count * sizeof *a);
  uint64_t rng = rng_seed(o.seed, 0);
  int ran = 0;
  double t0 = now_s();
  for (int k = 0; k < 4; k++) {
    if (strcmp(o.mode, "all") && strcmp(o.mode, all[k])) continue;
    t[k] = k < 3 ? phase_order(all[k], a, count, o.iters, &rng) : phase_list(count, o.iters, &rng);
    ran++;
  }
  double secs = now_s() - t0;
  free(a);
  if (!ran) {
    fprintf(stderr, "churn: unknown mode '%s' (accepted: lifo, fifo, random, list, all)\n", o.mode);
    return 2;
  }
  bench_result("churn", &o, (long)ran * count * o.iters, secs,
               "\"lifo_s\": %.6f, \"fifo_s\": %.6f, \"random_s\": %.6f, \"list_s\": %.6f", t[0], t[1], t[2], t[3]);
  return 0;
}
