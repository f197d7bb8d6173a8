/* Mixed local and remote frees: each thread frees a set share of its objects itself and sends the rest to the next thread. */
#include "common.h"

#define INBOX 1024 /* power of two: slots of the single-producer single-consumer ring from one thread to the next */
#define WINDOW 64  /* objects a thread keeps before freeing them itself (so local frees are not an immediate pair) */

struct msg {
  void *p;
  size_t n;
  uint64_t tag;
};

/* Thread i's inbox is filled by thread i-1 (ring order); head is written by the owner, tail by the sender. */
struct worker {
  struct msg inbox[INBOX];
  _Alignas(64) atomic_long head;
  _Alignas(64) atomic_long tail;
  _Alignas(64) atomic_int sent_all; /* set by this thread once it has sent everything it will send */
  struct worker *next, *prev;
  long objects, size;
  int local_pct;
  uint64_t rng;
  long local_frees, remote_frees;
  struct msg window[WINDOW];
  long wlen, wpos;
};

static void free_checked(struct msg *m, const char *where) {
  pat_check(m->p, m->n, m->tag, where);
  free(m->p);
}

/* Frees everything waiting in this thread's inbox (objects the previous thread allocated); returns how many. */
static long drain(struct worker *w) {
  long h = atomic_load_explicit(&w->head, memory_order_relaxed);
  long t = atomic_load_explicit(&w->tail, memory_order_acquire);
  for (long i = h; i < t; i++) free_checked(&w->inbox[i & (INBOX - 1)], "localremote-remote");
  if (t != h) atomic_store_explicit(&w->head, t, memory_order_release);
  w->remote_frees += t - h;
  return t - h;
}

static void send(struct worker *w, const struct msg *m) {
  struct worker *to = w->next;
  long t = atomic_load_explicit(&to->tail, memory_order_relaxed);
  /* Full: the next thread is behind. Serving our own inbox meanwhile keeps the ring from deadlocking. */
  while (t - atomic_load_explicit(&to->head, memory_order_acquire) >= INBOX) {
    if (!drain(w)) sched_yield();
  }
  to->inbox[t & (INBOX - 1)] = *m;
  atomic_store_explicit(&to->tail, t + 1, memory_order_release);
}

static void *run(void *arg) {
  struct worker *w = arg;
  for (long i = 0; i < w->objects; i++) {
    struct msg m;
    m.n = w->size ? (size_t)w->size : rng_log(&w->rng, 8, 2048);
    m.tag = rng_next(&w->rng);
    m.p = xmalloc(m.n);
    pat_fill(m.p, m.n, m.tag);
    if ((int)(rng_next(&w->rng) % 100) < w->local_pct) {
      /* Local: kept in a small FIFO window, the oldest freed by this thread when the window is full. */
      if (w->wlen == WINDOW) {
        free_checked(&w->window[w->wpos], "localremote-local");
        w->local_frees++;
        w->window[w->wpos] = m;
        w->wpos = (w->wpos + 1) % WINDOW;
      } else {
        w->window[w->wlen++] = m;
      }
    } else {
      send(w, &m);
    }
    if ((i & 63) == 63) drain(w);
  }
  atomic_store_explicit(&w->sent_all, 1, memory_order_release);
  for (long j = 0; j < w->wlen; j++) free_checked(&w->window[j], "localremote-local");
  w->local_frees += w->wlen;
  /* Keep serving the inbox until the sender has finished and everything it sent is freed. */
  for (;;) {
    int last = atomic_load_explicit(&w->prev->sent_all, memory_order_acquire);
    if (!drain(w) && last) break;
    if (!last) sched_yield();
  }
  return NULL;
}

int main(int argc, char **argv) {
  struct bench_opts o = {.threads = 2, .iters = 1000000, .size = 64, .seed = 1, .mode = "50"};
  bench_parse(argc, argv, &o,
              "localremote: -t threads in a ring, -n objects in all, -m percent freed by their own thread (the rest "
              "by the next thread; default 50), -s object size (0: mixed 8-2048 B)");
  long pct = bench_num(o.mode, "-m");
  if (pct > 100) {
    fprintf(stderr, "localremote: -m %ld: a percentage 0-100 is expected\n", pct);
    return 2;
  }
  int n = o.threads;
  struct worker *ws = aligned_alloc(64, sizeof(struct worker) * (size_t)n);
  pthread_t *th = calloc((size_t)n, sizeof *th);
  if (!ws || !th) return 4;
  memset(ws, 0, sizeof(struct worker) * (size_t)n);
  for (int i = 0; i < n; i++) {
    ws[i].next = &ws[(i + 1) % n];
    ws[i].prev = &ws[(i + n - 1) % n];
    ws[i].objects = o.iters / n + (i < o.iters % n ? 1 : 0);
    ws[i].size = o.size;
    ws[i].local_pct = (int)pct;
    ws[i].rng = rng_seed(o.seed, (uint64_t)i);
  }
  double t0 = now_s();
  for (int i = 0; i < n; i++) xpthread_create(&th[i], run, &ws[i]);
  for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
  double secs = now_s() - t0;
  long local = 0, remote = 0;
  for (int i = 0; i < n; i++) {
    local += ws[i].local_frees;
    remote += ws[i].remote_frees;
  }
  free(ws);
  free(th);
  bench_result("localremote", &o, local + remote, secs, "\"local_pct\": %ld, \"local_frees\": %ld, \"remote_frees\": %ld",
               pct, local, remote);
  if (local + remote != o.iters) {
    fprintf(stderr, "localremote: %ld objects freed, %ld allocated\n", local + remote, o.iters);
    return 5;
  }
  return 0;
}
