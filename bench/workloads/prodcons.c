/* Producer/consumer: producers allocate and fill, consumers check and free, so every free is a remote free. */
#include "common.h"

#define RING 1024 /* power of two: slots of one single-producer single-consumer ring */

struct msg {
  void *p;
  size_t n;
  uint64_t tag;
};

/* One producer-consumer pair shares a ring; head is written only by the consumer, tail only by the producer. */
struct pair {
  struct msg ring[RING];
  _Alignas(64) atomic_long head;
  _Alignas(64) atomic_long tail;
  _Alignas(64) long count;
  uint64_t rng;
  long consumed;
};

static void *producer(void *arg) {
  struct pair *q = arg;
  for (long i = 0; i < q->count; i++) {
    long t = atomic_load_explicit(&q->tail, memory_order_relaxed);
    while (t - atomic_load_explicit(&q->head, memory_order_acquire) >= RING) sched_yield();
    struct msg *m = &q->ring[t & (RING - 1)];
    m->n = rng_range(&q->rng, 16, 512);
    m->tag = rng_next(&q->rng);
    m->p = xmalloc(m->n);
    pat_fill(m->p, m->n, m->tag);
    atomic_store_explicit(&q->tail, t + 1, memory_order_release);
  }
  return NULL;
}

static void *consumer(void *arg) {
  struct pair *q = arg;
  for (long i = 0; i < q->count; i++) {
    long h = atomic_load_explicit(&q->head, memory_order_relaxed);
    while (atomic_load_explicit(&q->tail, memory_order_acquire) <= h) sched_yield();
    struct msg *m = &q->ring[h & (RING - 1)];
    pat_check(m->p, m->n, m->tag, "prodcons");
    free(m->p);
    atomic_store_explicit(&q->head, h + 1, memory_order_release);
    q->consumed++;
  }
  return NULL;
}


int main(int argc, char **argv) {
  struct bench_opts o = {.threads = 2, .iters = 200000, .size = 0, .seed = 1};
  bench_parse(argc, argv, &o, "prodcons: -t threads (pairs = max(1, t/2)), -n objects per pair");
  int pairs = o.threads / 2 > 0 ? o.threads / 2 : 1;
  struct pair *qs = aligned_alloc(64, sizeof(struct pair) * (size_t)pairs);
  memset(qs, 0, sizeof(struct pair) * (size_t)pairs);
  pthread_t *th = calloc((size_t)pairs * 2, sizeof *th);
  double t0 = now_s();
  for (int i = 0; i < pairs; i++) {
    qs[i].count = o.iters;
    qs[i].rng = rng_seed(o.seed, (uint64_t)i);
    xpthread_create(&th[2 * i], producer, &qs[i]);
    xpthread_create(&th[2 * i + 1], consumer, &qs[i]);
  }
  long ops = 0;
  for (int i = 0; i < pairs * 2; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < pairs; i++) ops += qs[i].consumed;
  double secs = now_s() - t0;
  free(th);
  free(qs);
  bench_result("prodcons", &o, ops, secs, "\"pairs\": %d", pairs);
  return ops == (long)pairs * o.iters ? 0 : 5;
}
