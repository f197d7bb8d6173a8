/* Fixed-time server simulation (larson-style): threads replace random objects and trade slot arrays; reports ops/s. */
#include "common.h"

/* One slot of a connection's array: the object, its size and the tag its pattern was written with. */
struct slot {
  void *p;
  size_t n;
  uint64_t tag;
};

/* The slot arrays in play: one per thread plus one spare, which waits at the exchange for the next thread. */
struct exchange {
  pthread_mutex_t mu;
  struct slot *spare;
  long swaps;
};

struct worker {
  struct exchange *ex;
  struct slot *slots; /* the array this thread serves now; traded at the exchange, so objects die elsewhere */
  long nslots, per_swap;
  uint64_t rng;
  long ops, swaps;
};

static atomic_int stop_flag;

static void fill_slot(struct slot *s, uint64_t *rng) {
  s->n = rng_range(rng, 16, 1000);
  s->tag = rng_next(rng);
  s->p = xmalloc(s->n);
  pat_fill(s->p, s->n, s->tag);
}

static void *serve(void *arg) {
  struct worker *w = arg;
  long since_swap = 0;
  while (!atomic_load_explicit(&stop_flag, memory_order_relaxed)) {
    /* A short burst between looks at the clock's flag keeps the check off the profile. */
    for (int k = 0; k < 64; k++) {
      struct slot *s = &w->slots[rng_next(&w->rng) % (uint64_t)w->nslots];
      pat_check(s->p, s->n, s->tag, "server");
      free(s->p);
      fill_slot(s, &w->rng);
    }
    w->ops += 64;
    since_swap += 64;
    if (since_swap >= w->per_swap) {
      /* Hand this array to whichever thread comes next and take the one the previous thread left. */
      since_swap = 0;
      pthread_mutex_lock(&w->ex->mu);
      struct slot *mine = w->slots;
      w->slots = w->ex->spare;
      w->ex->spare = mine;
      w->ex->swaps++;
      pthread_mutex_unlock(&w->ex->mu);
      w->swaps++;
    }
  }
  return NULL;
}

static struct slot *new_array(long n, uint64_t *rng) {
  struct slot *a = xmalloc((size_t)n * sizeof *a);
  for (long j = 0; j < n; j++) fill_slot(&a[j], rng);
  return a;
}

static void check_and_free_array(struct slot *a, long n) {
  for (long j = 0; j < n; j++) {
    pat_check(a[j].p, a[j].n, a[j].tag, "server-final");
    free(a[j].p);
  }
  free(a);
}

int main(int argc, char **argv) {
  /* -w is the run time in milliseconds; -n the replacements a thread makes between two trades of its array. */
  struct bench_opts o = {.threads = 2, .iters = 10000, .size = 1000, .seed = 1, .wait_ms = 1000};
  bench_parse(argc, argv, &o,
              "server: -t threads, -w run time in ms, -s slots per array, -n replacements between array trades; "
              "random 16-1000 B objects");
  long nslots = o.size > 0 ? o.size : 1;
  long per_swap = o.iters > 0 ? o.iters : 1;
  long run_ms = o.wait_ms > 0 ? o.wait_ms : 1;
  uint64_t main_rng = rng_seed(o.seed, 0xffff);
  struct exchange ex = {.mu = PTHREAD_MUTEX_INITIALIZER};
  /* The main thread fills every array, so the first replacements already free objects another thread made. */
  ex.spare = new_array(nslots, &main_rng);
  struct worker *ws = calloc((size_t)o.threads, sizeof *ws);
  pthread_t *th = calloc((size_t)o.threads, sizeof *th);
  if (!ws || !th) return 4;
  for (int i = 0; i < o.threads; i++) {
    ws[i] = (struct worker){.ex = &ex, .nslots = nslots, .per_swap = per_swap, .rng = rng_seed(o.seed, (uint64_t)i)};
    ws[i].slots = new_array(nslots, &main_rng);
  }

  double t0 = now_s();
  for (int i = 0; i < o.threads; i++) xpthread_create(&th[i], serve, &ws[i]);
  bench_sleep_ms(run_ms);
  atomic_store(&stop_flag, 1);
  long ops = 0, swaps = 0;
  for (int i = 0; i < o.threads; i++) {
    pthread_join(th[i], NULL);
    ops += ws[i].ops;
    swaps += ws[i].swaps;
  }
  double secs = now_s() - t0;
  long peak = proc_status_kib("VmHWM");

  for (int i = 0; i < o.threads; i++) check_and_free_array(ws[i].slots, nslots);
  check_and_free_array(ex.spare, nslots);
  free(ws);
  free(th);
  bench_result("server", &o, ops, secs, "\"run_ms\": %ld, \"slots\": %ld, \"trades\": %ld, \"hwm_run_kib\": %ld",
               run_ms, nslots, swaps, peak);
  return swaps == ex.swaps ? 0 : 5;
}
