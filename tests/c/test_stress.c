/* test_stress.c — multi-threaded stress: producers allocate, consumers on other threads verify and free (remote frees). */
#include "mtest.h"
static uint64_t stress_seed;
#include <pthread.h>

#define NPROD 6
#define NCONS 6
#define PER_PRODUCER 60000
#define RING 1024

/* A block carries a header naming its size and tag; the rest is the tag's byte pattern. */
typedef struct { uint64_t magic, size, tag; } hdr_t;
#define MAGIC 0x4D414C4C41524421ull

/* One bounded queue per consumer (mutex + condition variables: simple and obviously correct). */
typedef struct {
  pthread_mutex_t lock;
  pthread_cond_t not_empty, not_full;
  void *items[RING];
  size_t head, tail, count;
  int producers_left;
} queue_t;
static queue_t queues[NCONS];

static void q_push(queue_t *q, void *p) {
  pthread_mutex_lock(&q->lock);
  while (q->count == RING) pthread_cond_wait(&q->not_full, &q->lock);
  q->items[q->tail] = p;
  q->tail = (q->tail + 1) % RING;
  q->count++;
  pthread_cond_signal(&q->not_empty);
  pthread_mutex_unlock(&q->lock);
}
/* NULL once every producer has finished and the queue is drained. */
static void *q_pop(queue_t *q) {
  pthread_mutex_lock(&q->lock);
  while (q->count == 0 && q->producers_left > 0) pthread_cond_wait(&q->not_empty, &q->lock);
  void *p = NULL;
  if (q->count) {
    p = q->items[q->head];
    q->head = (q->head + 1) % RING;
    q->count--;
    pthread_cond_signal(&q->not_full);
  }
  pthread_mutex_unlock(&q->lock);
  return p;
}

static size_t pick_size(mt_rng_t *r) {
  uint64_t x = mt_rng_below(r, 1000);
  if (x < 700) return sizeof(hdr_t) + mt_rng_below(r, 256);          /* small */
  if (x < 950) return sizeof(hdr_t) + mt_rng_below(r, 8192);         /* small pages, all classes */
  if (x < 995) return 8192 + mt_rng_below(r, 256 * 1024);            /* medium */
  return 256 * 1024 + mt_rng_below(r, 3 * 1024 * 1024);              /* large and a few huge */
}

/* Verify header and pattern (sampled in big blocks), then free. */
static _Atomic(uint64_t) freed_count, bytes_checked;
static void consume(void *p) {
  hdr_t *h = p;
  CHECK(h->magic == MAGIC, "block %p: bad magic %#llx", p, (unsigned long long)h->magic);
  if (h->magic != MAGIC) return;
  uint8_t *body = (uint8_t *)(h + 1);
  size_t n = h->size - sizeof(hdr_t);
  size_t check = n < 65536 ? n : 4096;
  size_t bad = mt_verify(body, check, h->tag);
  CHECK(bad == check, "block %p (size %llu, tag %llu): byte %zu wrong", p, (unsigned long long)h->size,
        (unsigned long long)h->tag, bad);
  if (n > check) CHECK(body[n - 1] == mt_pat(h->tag, n - 1), "block %p: last byte wrong", p);
  CHECK(M_usable(p) >= h->size, "usable size %zu < %llu", M_usable(p), (unsigned long long)h->size);
  h->magic = 0;   /* a second free of the same block would show up as a bad magic */
  atomic_fetch_add(&bytes_checked, check);
  M_free(p);
  atomic_fetch_add(&freed_count, 1);
}

static void *producer(void *arg) {
  unsigned id = (unsigned)(uintptr_t)arg;
  mt_rng_t r;
  mt_rng_seed(&r, stress_seed * 7919 + 1000 + id);
  /* Some blocks the producer keeps and frees itself, interleaved with those it hands over (local + remote frees). */
  enum { KEEP = 64 };
  void *kept[KEEP] = { 0 };
  for (unsigned i = 0; i < PER_PRODUCER; i++) {
    size_t n = pick_size(&r);
    hdr_t *h = (i % 3 == 0) ? M_calloc(1, n) : M_malloc(n);
    REQUIRE(h, "producer %u: allocation of %zu failed", id, n);
    CHECK(((uintptr_t)h & 15) == 0, "misaligned %p", (void *)h);
    h->magic = MAGIC;
    h->size = n;
    h->tag = ((uint64_t)id << 32) | i;
    size_t body = n - sizeof(hdr_t);
    if (body < 65536) mt_fill(h + 1, body, h->tag);
    else { mt_fill(h + 1, 4096, h->tag); ((uint8_t *)(h + 1))[body - 1] = mt_pat(h->tag, body - 1); }
    if (i % 5 == 4) {
      unsigned k = (unsigned)mt_rng_below(&r, KEEP);
      if (kept[k]) consume(kept[k]);
      kept[k] = h;
    } else {
      q_push(&queues[(id + i) % NCONS], h);
    }
  }
  for (unsigned k = 0; k < KEEP; k++) if (kept[k]) consume(kept[k]);
  for (unsigned c = 0; c < NCONS; c++) {
    pthread_mutex_lock(&queues[c].lock);
    queues[c].producers_left--;
    pthread_cond_broadcast(&queues[c].not_empty);
    pthread_mutex_unlock(&queues[c].lock);
  }
  return NULL;
}

static void *consumer(void *arg) {
  queue_t *q = &queues[(uintptr_t)arg];
  mt_rng_t r;
  mt_rng_seed(&r, stress_seed * 31 + 77 + (uintptr_t)arg);
  /* Hold a window of blocks before freeing them, so frees arrive out of order and while producers allocate. */
  enum { WINDOW = 256 };
  void *win[WINDOW] = { 0 };
  void *p;
  while ((p = q_pop(q)) != NULL) {
    unsigned k = (unsigned)mt_rng_below(&r, WINDOW);
    if (win[k]) consume(win[k]);
    win[k] = p;
  }
  for (unsigned k = 0; k < WINDOW; k++) if (win[k]) consume(win[k]);
  return NULL;
}

int main(int argc, char **argv) {
  /* Seed of the producers' sizes: argv[1] or MALLARD_TEST_SEED (scripts/soak.sh), 0 by default (the CI run). */
  const char *sd = argc > 1 ? argv[1] : getenv("MALLARD_TEST_SEED");
  stress_seed = sd ? strtoull(sd, NULL, 0) : 0;
  printf("test_stress (%s): seed %llu (replay: %s %llu)\n", MT_MODE, (unsigned long long)stress_seed, argv[0],
         (unsigned long long)stress_seed);
  fflush(stdout);
  double t0 = mt_now();
  for (int c = 0; c < NCONS; c++) {
    pthread_mutex_init(&queues[c].lock, NULL);
    pthread_cond_init(&queues[c].not_empty, NULL);
    pthread_cond_init(&queues[c].not_full, NULL);
    queues[c].producers_left = NPROD;
  }
  size_t len = sizeof(size_t);
  size_t alloc0 = 0;
  int rc = MT_CTL("stats.allocated", &alloc0, &len, NULL, 0);
  REQUIRE(rc == 0 && len == sizeof(size_t), "mallard_ctl(stats.allocated) = %d, len %zu", rc, len);
  pthread_t prod[NPROD], cons[NCONS];
  for (uintptr_t i = 0; i < NCONS; i++) REQUIRE(!pthread_create(&cons[i], NULL, consumer, (void *)i), "create");
  for (uintptr_t i = 0; i < NPROD; i++) REQUIRE(!pthread_create(&prod[i], NULL, producer, (void *)i), "create");
  for (int i = 0; i < NPROD; i++) pthread_join(prod[i], NULL);
  for (int i = 0; i < NCONS; i++) pthread_join(cons[i], NULL);
  uint64_t want = (uint64_t)NPROD * PER_PRODUCER;
  CHECK(atomic_load(&freed_count) == want, "freed %llu of %llu blocks", (unsigned long long)atomic_load(&freed_count),
        (unsigned long long)want);
  /* Every block came back: the live-bytes statistic returns to where it started (give or take the test's own). */
  size_t alloc1 = 0;
  len = sizeof(size_t);
  rc = MT_CTL("stats.allocated", &alloc1, &len, NULL, 0);
  REQUIRE(rc == 0 && len == sizeof(size_t), "mallard_ctl(stats.allocated) = %d, len %zu", rc, len);
  printf("stats.allocated before %zu after %zu\n", alloc0, alloc1);
  CHECK(alloc1 <= alloc0 + 256 * 1024, "stats.allocated grew from %zu to %zu after freeing everything", alloc0, alloc1);
  printf("%llu blocks through %d producers and %d consumers, %.1f MB verified, %.2f s\n", (unsigned long long)want,
         NPROD, NCONS, (double)atomic_load(&bytes_checked) / 1e6, mt_now() - t0);
  return mt_result("test_stress (" MT_MODE ")");
}
