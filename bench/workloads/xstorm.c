/* Many-to-many storm: producers allocate batches of small objects, consumers that never allocate check and free them. */
#include "common.h"

/*
 * A batch is one block the producer allocates: the queue link, the seed that regenerates every object's size and
 * tag, and the objects' addresses. The queue's nodes are these blocks, so a consumer never needs memory of its own:
 * it only checks and frees (the objects, then the batch block itself).
 */
struct batch {
  struct batch *next;
  uint64_t seed;
  uint64_t check; /* seed ^ count ^ BATCH_MAGIC: a batch block overwritten in the queue is caught */
  long count;
  void *obj[];
};
#define BATCH_MAGIC 0x78a5f0c3d2e1b497ULL

/* The one shared bounded queue: a FIFO of batches under a mutex, at most `cap` batches waiting. */
struct queue {
  pthread_mutex_t mu;
  pthread_cond_t not_empty, not_full;
  struct batch *head, *tail;
  long len, cap;
  int producers_left;
  long full_waits; /* how often a producer found the queue full (consumers too slow) */
};

struct producer {
  struct queue *q;
  long objects, batch;
  long size; /* 0: mixed sizes */
  uint64_t rng;
};

struct consumer {
  struct queue *q;
  long size;
  int alloc_on_purpose; /* -m alloc-in-consumer: the test's deliberate fault, which the nomalloc shim must catch */
  long objects, batches;
};

/*
 * Hook for the test that consumers never allocate (tests/bench): libmbench-nomalloc.so, when preloaded, defines it
 * and from then on fails the run if the calling thread enters malloc, calloc, realloc or any aligned allocation.
 * Without that library the weak reference stays NULL and nothing happens.
 */
extern void mbench_forbid_malloc_in_this_thread(void) __attribute__((weak));

/* Size and tag of the next object of a batch, from the batch's own generator: producer and consumer agree. */
static inline size_t next_size(uint64_t *r, long size) {
  return size ? (size_t)size : rng_log(r, 8, 2048);
}

static void *produce(void *arg) {
  struct producer *p = arg;
  struct queue *q = p->q;
  for (long done = 0; done < p->objects;) {
    long n = p->objects - done < p->batch ? p->objects - done : p->batch;
    struct batch *b = xmalloc(sizeof *b + (size_t)n * sizeof(void *));
    b->next = NULL;
    b->seed = rng_next(&p->rng);
    b->count = n;
    b->check = b->seed ^ (uint64_t)n ^ BATCH_MAGIC;
    uint64_t r = b->seed | 1;
    for (long i = 0; i < n; i++) {
      size_t sz = next_size(&r, p->size);
      uint64_t tag = rng_next(&r);
      b->obj[i] = xmalloc(sz);
      pat_fill(b->obj[i], sz, tag);
    }
    pthread_mutex_lock(&q->mu);
    if (q->len >= q->cap) q->full_waits++;
    while (q->len >= q->cap) pthread_cond_wait(&q->not_full, &q->mu);
    if (q->tail)
      q->tail->next = b;
    else
      q->head = b;
    q->tail = b;
    q->len++;
    pthread_cond_signal(&q->not_empty);
    pthread_mutex_unlock(&q->mu);
    done += n;
  }
  pthread_mutex_lock(&q->mu);
  if (--q->producers_left == 0) pthread_cond_broadcast(&q->not_empty);
  pthread_mutex_unlock(&q->mu);
  return NULL;
}

static void *consume(void *arg) {
  struct consumer *c = arg;
  struct queue *q = c->q;
  if (mbench_forbid_malloc_in_this_thread) mbench_forbid_malloc_in_this_thread();
  for (;;) {
    pthread_mutex_lock(&q->mu);
    while (!q->head && q->producers_left > 0) pthread_cond_wait(&q->not_empty, &q->mu);
    struct batch *b = q->head;
    if (!b) { /* empty and every producer finished */
      pthread_mutex_unlock(&q->mu);
      return NULL;
    }
    q->head = b->next;
    if (!q->head) q->tail = NULL;
    q->len--;
    pthread_cond_signal(&q->not_full);
    pthread_mutex_unlock(&q->mu);

    if ((b->seed ^ (uint64_t)b->count ^ BATCH_MAGIC) != b->check)
      bench_die("xstorm: batch %p was overwritten (count %ld)", (void *)b, b->count);
    uint64_t r = b->seed | 1;
    for (long i = 0; i < b->count; i++) {
      size_t sz = next_size(&r, c->size);
      uint64_t tag = rng_next(&r);
      pat_check(b->obj[i], sz, tag, "xstorm");
      free(b->obj[i]);
    }
    c->objects += b->count;
    c->batches++;
    free(b);
    if (c->alloc_on_purpose) free(xmalloc(16));
  }
}

int main(int argc, char **argv) {
  /* -w is reused as the number of objects per batch. */
  struct bench_opts o = {.threads = 2, .iters = 1000000, .size = 64, .seed = 1, .wait_ms = 64};
  bench_parse(argc, argv, &o,
              "xstorm: -t threads (max(1, t/2) producers, the rest (at least 1) consumers), -n objects in all, "
              "-s object size (0: mixed 8-2048 B), -w objects per batch; -m alloc-in-consumer (tests only) makes "
              "consumers allocate, which they never do otherwise");
  int alloc_on_purpose = 0;
  if (o.mode && strcmp(o.mode, "alloc-in-consumer") == 0) {
    alloc_on_purpose = 1;
  } else if (o.mode) {
    fprintf(stderr, "xstorm: unknown mode -m %s\n", o.mode);
    return 2;
  }
  if (o.size > 1 << 20) {
    fprintf(stderr, "xstorm: -s %ld is not a small object size\n", o.size);
    return 2;
  }
  int np = o.threads / 2 > 0 ? o.threads / 2 : 1;
  int nc = o.threads - np > 0 ? o.threads - np : 1;
  long batch = o.wait_ms > 0 ? o.wait_ms : 1;
  struct queue q = {.mu = PTHREAD_MUTEX_INITIALIZER, .not_empty = PTHREAD_COND_INITIALIZER,
                    .not_full = PTHREAD_COND_INITIALIZER, .cap = 4L * (np + nc), .producers_left = np};
  struct producer *ps = calloc((size_t)np, sizeof *ps);
  struct consumer *cs = calloc((size_t)nc, sizeof *cs);
  pthread_t *th = calloc((size_t)(np + nc), sizeof *th);
  if (!ps || !cs || !th) return 4;
  for (int i = 0; i < np; i++) {
    ps[i] = (struct producer){.q = &q, .batch = batch, .size = o.size, .rng = rng_seed(o.seed, (uint64_t)i),
                              .objects = o.iters / np + (i < o.iters % np ? 1 : 0)};
  }
  for (int i = 0; i < nc; i++) cs[i] = (struct consumer){.q = &q, .size = o.size, .alloc_on_purpose = alloc_on_purpose};

  double t0 = now_s();
  for (int i = 0; i < nc; i++) xpthread_create(&th[np + i], consume, &cs[i]);
  for (int i = 0; i < np; i++) xpthread_create(&th[i], produce, &ps[i]);
  for (int i = 0; i < np + nc; i++) pthread_join(th[i], NULL);
  double secs = now_s() - t0;

  long objects = 0, batches = 0;
  for (int i = 0; i < nc; i++) {
    objects += cs[i].objects;
    batches += cs[i].batches;
  }
  free(ps);
  free(cs);
  free(th);
  bench_result("xstorm", &o, objects, secs,
               "\"producers\": %d, \"consumers\": %d, \"batch\": %ld, \"batches\": %ld, \"queue_full_waits\": %ld",
               np, nc, batch, batches, q.full_waits);
  if (objects != o.iters) {
    fprintf(stderr, "xstorm: %ld objects consumed, %ld produced\n", objects, o.iters);
    return 5;
  }
  return 0;
}
