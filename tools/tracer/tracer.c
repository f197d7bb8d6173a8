/* Interposing malloc tracer of `mallard profile`: counts calls, sizes and live bytes per thread, writes one JSON record per process. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "asjson.h"

/*
 * Safety rules (the tracer runs inside other people's programs):
 * - every path that can run in a signal handler (_exit, _Exit, the exec family) takes no lock, allocates nothing
 *   and calls only async-signal-safe functions: the record is written raw (unsorted, duplicates allowed) through a
 *   small static buffer, and `mallard profile` sorts and merges it;
 * - stack use is small and bounded (no large locals: the writer's buffers are static, guarded by the single-writer
 *   claim below; -Wframe-larger-than enforces it at build time);
 * - exactly one record per process image: a writer claims the record first; a failed exec gives the claim back.
 */

#define EXPORT __attribute__((visibility("default")))

enum fn_id { F_MALLOC, F_CALLOC, F_REALLOC, F_FREE, F_ALIGNED_ALLOC, F_POSIX_MEMALIGN, F_MEMALIGN,
             F_VALLOC, F_PVALLOC, F_REALLOCARRAY, F_COUNT };
static const char *const fn_names[F_COUNT] = {"malloc", "calloc", "realloc", "free", "aligned_alloc",
                                              "posix_memalign", "memalign", "valloc", "pvalloc", "reallocarray"};

#define HIST_BUCKETS 65       /* bucket 0: size 0; bucket b: sizes in [2^(b-1), 2^b) */
#define SIZE_SLOTS 2048       /* per-thread open-addressing table of (function, exact size) -> calls; power of two */
#define FLUSH_BYTES (32 << 10) /* a thread publishes its live-bytes delta once it exceeds this ... */
#define FLUSH_OBJECTS 64      /* ... or this many objects, so peaks are exact to within these per thread */
#define MERGE_SLOTS (1u << 16) /* process-wide (function, size) table of exited threads */
#define MAX_THREADS_LISTED 4096 /* threads written one by one; all of them are in the totals */
#define MAX_LIST_WALK (1u << 20) /* bound on a lock-free walk of the record list (it only grows) */

struct size_slot {
    uint64_t key; /* (function << 56) | size, 0 = empty (size 0 is stored as key 1<<55 | fn) */
    uint64_t count;
};

enum rec_state { REC_FREE, REC_LIVE };

/* One thread's counters; written only by its owner, read by the record writer (racy reads are tolerated). */
struct thread_rec {
    struct thread_rec *next; /* in the process's list of records: only ever pushed, never unlinked */
    atomic_int state;        /* REC_LIVE while a thread owns it; REC_FREE once folded, ready for a new thread */
    pid_t tid;
    uint64_t calls[F_COUNT];
    uint64_t hist[HIST_BUCKETS];
    uint64_t size_overflow; /* calls whose size did not fit in the table */
    int64_t delta_bytes, delta_objects;   /* live change not yet published to the process totals */
    int64_t delta_max_bytes, delta_max_objects; /* highest points of those deltas since the last publish */
    struct size_slot sizes[SIZE_SLOTS];
};

/* The real allocator underneath, found with dlsym(RTLD_NEXT, ...). */
static void *(*real_malloc)(size_t);
static void *(*real_calloc)(size_t, size_t);
static void *(*real_realloc)(void *, size_t);
static void (*real_free)(void *);
static void *(*real_aligned_alloc)(size_t, size_t);
static int (*real_posix_memalign)(void **, size_t, size_t);
static void *(*real_memalign)(size_t, size_t);
static void *(*real_valloc)(size_t);
static void *(*real_pvalloc)(size_t);
static size_t (*real_usable)(void *);
static int (*real_execve)(const char *, char *const[], char *const[]);
static int (*real_execvpe)(const char *, char *const[], char *const[]);
static int (*real_fexecve)(int, char *const[], char *const[]);
static void (*real__exit)(int) __attribute__((noreturn));
static void (*real__Exit)(int) __attribute__((noreturn));
static void (*real_quick_exit)(int) __attribute__((noreturn));

/* 0: nothing resolved; 1: a thread is resolving (others spin, the resolver uses the bootstrap buffer); 2: ready. */
static atomic_int init_state;
static __thread int tls_resolving;
static __thread int tls_busy; /* inside the tracer: calls are forwarded uncounted */
static __thread struct thread_rec *tls_rec __attribute__((tls_model("initial-exec")));

/* Bootstrap buffer for calls made while dlsym runs; its blocks are never freed. */
static char boot_buf[64 << 10] __attribute__((aligned(64)));
static atomic_size_t boot_used;

/* Serialises thread exits (folding into the aggregates below); never taken on the hot path nor by the writer. */
static pthread_mutex_t fold_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(struct thread_rec *) recs; /* every record ever made, newest first */

/* Exited threads: their counts are folded into these aggregates, their per-thread totals kept compactly. */
struct retired_thread {
    pid_t tid;
    uint64_t calls[F_COUNT];
};
static uint64_t retired_calls[F_COUNT], retired_hist[HIST_BUCKETS], retired_overflow;
static struct size_slot *retired_sizes; /* MERGE_SLOTS entries, mapped on first use */
/* Grown by doubling; an outgrown array is never unmapped, so a lock-free reader can finish with it. */
static _Atomic(struct retired_thread *) retired;
static atomic_size_t n_retired;
static size_t cap_retired;
static pthread_key_t exit_key;
static int have_key;

static atomic_llong live_bytes, live_objects, peak_bytes, peak_objects;
static struct timespec t_start;
static char trace_dir[PATH_MAX];
static pid_t my_pid;

/* The record's claim: 0 free, else the tid of the thread writing it (or 1 once written). */
#define CLAIM_DONE 1
static atomic_int record_claim;

static int is_boot(const void *p)
{
    return (const char *)p >= boot_buf && (const char *)p < boot_buf + sizeof boot_buf;
}

static void *boot_alloc(size_t size, size_t align)
{
    if (align < 16)
        align = 16;
    size_t hdr = align; /* room for the 8-byte size in front of the block, keeping the alignment */
    if (size > sizeof boot_buf)
        return NULL;
    size_t need = hdr + ((size + 15) & ~(size_t)15);
    size_t old = atomic_load(&boot_used);
    for (;;) {
        size_t base = ((uintptr_t)boot_buf + old + align - 1) & ~(uintptr_t)(align - 1);
        size_t start = base - (uintptr_t)boot_buf;
        if (start + need > sizeof boot_buf)
            return NULL;
        if (atomic_compare_exchange_weak(&boot_used, &old, start + need)) {
            char *p = boot_buf + start + hdr;
            ((size_t *)p)[-1] = size;
            return p;
        }
    }
}

static void *sym(const char *name)
{
    return dlsym(RTLD_NEXT, name);
}

static void resolve_all(void)
{
    real_malloc = sym("malloc");
    real_calloc = sym("calloc");
    real_realloc = sym("realloc");
    real_free = sym("free");
    real_aligned_alloc = sym("aligned_alloc");
    real_posix_memalign = sym("posix_memalign");
    real_memalign = sym("memalign");
    real_valloc = sym("valloc");
    real_pvalloc = sym("pvalloc");
    real_usable = sym("malloc_usable_size");
    real_execve = sym("execve");
    real_execvpe = sym("execvpe");
    real_fexecve = sym("fexecve");
    real__exit = sym("_exit");
    real__Exit = sym("_Exit");
    real_quick_exit = sym("quick_exit");
}

/* Returns 1 when the real functions are usable by this thread, 0 when it must use the bootstrap buffer. */
static int ensure_init(void)
{
    if (__builtin_expect(atomic_load_explicit(&init_state, memory_order_acquire) == 2, 1))
        return 1;
    if (tls_resolving)
        return 0;
    int expected = 0;
    if (atomic_compare_exchange_strong(&init_state, &expected, 1)) {
        tls_resolving = 1;
        resolve_all();
        clock_gettime(CLOCK_MONOTONIC, &t_start);
        tls_resolving = 0;
        atomic_store_explicit(&init_state, 2, memory_order_release);
        return 1;
    }
    while (atomic_load_explicit(&init_state, memory_order_acquire) != 2)
        sched_yield();
    return 1;
}

static int ready(void)
{
    return atomic_load_explicit(&init_state, memory_order_acquire) == 2;
}

static void *map_pages(size_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static inline uint64_t slot_hash(uint64_t key)
{
    return key * 0x9E3779B97F4A7C15ULL;
}

/* Adds count to key in a MERGE_SLOTS table; returns 0 when the table is full. */
static int merge_slot(struct size_slot *table, uint64_t key, uint64_t count)
{
    uint64_t h = slot_hash(key) >> 48;
    for (unsigned j = 0; j < MERGE_SLOTS; j++) {
        struct size_slot *s = &table[(h + j) & (MERGE_SLOTS - 1)];
        if (s->key == key || s->key == 0) {
            s->key = key;
            s->count += count;
            return 1;
        }
    }
    return 0;
}

static void publish(struct thread_rec *r)
{
    /* The thread's own high point since the last publish, on top of the total it saw: exact for one thread. */
    long long b = atomic_fetch_add_explicit(&live_bytes, r->delta_bytes, memory_order_relaxed) + r->delta_max_bytes;
    long long o = atomic_fetch_add_explicit(&live_objects, r->delta_objects, memory_order_relaxed) + r->delta_max_objects;
    r->delta_bytes = r->delta_objects = r->delta_max_bytes = r->delta_max_objects = 0;
    long long pb = atomic_load_explicit(&peak_bytes, memory_order_relaxed);
    while (b > pb && !atomic_compare_exchange_weak_explicit(&peak_bytes, &pb, b, memory_order_relaxed, memory_order_relaxed))
        ;
    long long po = atomic_load_explicit(&peak_objects, memory_order_relaxed);
    while (o > po && !atomic_compare_exchange_weak_explicit(&peak_objects, &po, o, memory_order_relaxed, memory_order_relaxed))
        ;
}

/* Folds an exited thread's record into the process aggregates. Called with fold_lock held. */
static void fold_retired(struct thread_rec *r)
{
    for (int f = 0; f < F_COUNT; f++)
        retired_calls[f] += r->calls[f];
    for (int h = 0; h < HIST_BUCKETS; h++)
        retired_hist[h] += r->hist[h];
    retired_overflow += r->size_overflow;
    if (!retired_sizes)
        retired_sizes = map_pages(MERGE_SLOTS * sizeof(struct size_slot));
    for (unsigned i = 0; i < SIZE_SLOTS; i++)
        if (r->sizes[i].key && (!retired_sizes || !merge_slot(retired_sizes, r->sizes[i].key, r->sizes[i].count)))
            retired_overflow += r->sizes[i].count;
    size_t n = atomic_load(&n_retired);
    struct retired_thread *arr = atomic_load(&retired);
    /* A thread that allocates again in a later TLS destructor comes back here: one entry per tid. */
    if (n > 0 && arr[n - 1].tid == r->tid) {
        for (int f = 0; f < F_COUNT; f++)
            arr[n - 1].calls[f] += r->calls[f];
        return;
    }
    if (n == cap_retired) {
        size_t cap = cap_retired ? 2 * cap_retired : 256;
        struct retired_thread *grown = map_pages(cap * sizeof *grown);
        if (!grown)
            return;
        if (arr)
            memcpy(grown, arr, n * sizeof *grown);
        atomic_store(&retired, grown);
        cap_retired = cap;
        arr = grown;
    }
    arr[n].tid = r->tid;
    memcpy(arr[n].calls, r->calls, sizeof r->calls);
    atomic_store(&n_retired, n + 1); /* the entry is complete before a reader can count it */
}

static void clear_counts(struct thread_rec *r)
{
    memset(r->calls, 0, sizeof r->calls);
    memset(r->hist, 0, sizeof r->hist);
    memset(r->sizes, 0, sizeof r->sizes);
    r->size_overflow = 0;
    r->delta_bytes = r->delta_objects = r->delta_max_bytes = r->delta_max_objects = 0;
}

static void thread_exit_cb(void *arg)
{
    struct thread_rec *r = arg;
    /* The thread is gone: its counts move to the aggregates and its record is recycled. */
    if (tls_rec == r)
        tls_rec = NULL;
    int was_busy = tls_busy;
    tls_busy = 1;
    pthread_mutex_lock(&fold_lock);
    publish(r);
    fold_retired(r);
    clear_counts(r);
    atomic_store(&r->state, REC_FREE);
    pthread_mutex_unlock(&fold_lock);
    tls_busy = was_busy;
}

static struct thread_rec *new_rec(void)
{
    tls_busy = 1;
    struct thread_rec *r = NULL;
    /* Reuse a record of an exited thread (thread churn stays bounded), else map a new one and push it. */
    unsigned walked = 0;
    for (struct thread_rec *x = atomic_load(&recs); x && walked < MAX_LIST_WALK; x = x->next, walked++) {
        int expected = REC_FREE;
        if (atomic_load_explicit(&x->state, memory_order_relaxed) == REC_FREE &&
            atomic_compare_exchange_strong(&x->state, &expected, REC_LIVE)) {
            r = x;
            break;
        }
    }
    if (!r) {
        r = map_pages(sizeof *r);
        if (r) {
            atomic_store_explicit(&r->state, REC_LIVE, memory_order_relaxed);
            struct thread_rec *head = atomic_load(&recs);
            do
                r->next = head;
            while (!atomic_compare_exchange_weak(&recs, &head, r));
        }
    }
    if (r) {
        r->tid = (pid_t)syscall(SYS_gettid);
        if (have_key)
            pthread_setspecific(exit_key, r);
    }
    tls_rec = r;
    tls_busy = 0;
    return r;
}

static inline unsigned bucket_of(size_t size)
{
    return size == 0 ? 0 : 64 - (unsigned)__builtin_clzll((unsigned long long)size);
}

static inline void track_live(struct thread_rec *r, long long bytes, long long objects)
{
    r->delta_bytes += bytes;
    r->delta_objects += objects;
    if (r->delta_bytes > r->delta_max_bytes)
        r->delta_max_bytes = r->delta_bytes;
    if (r->delta_objects > r->delta_max_objects)
        r->delta_max_objects = r->delta_objects;
    if (r->delta_bytes >= FLUSH_BYTES || r->delta_bytes <= -FLUSH_BYTES || r->delta_objects >= FLUSH_OBJECTS ||
        r->delta_objects <= -FLUSH_OBJECTS)
        publish(r);
}

/* Counts one call of fn with a requested size (has_size) on this thread; returns its record or NULL when not counted. */
static inline struct thread_rec *count(enum fn_id fn, int has_size, size_t size)
{
    if (tls_busy)
        return NULL;
    struct thread_rec *r = tls_rec;
    if (__builtin_expect(r == NULL, 0)) {
        r = new_rec();
        if (!r)
            return NULL;
    }
    r->calls[fn]++;
    if (has_size) {
        r->hist[bucket_of(size)]++;
        uint64_t key = ((uint64_t)fn << 56) | (size & ((1ULL << 55) - 1)) | (1ULL << 55);
        uint64_t h = slot_hash(key) >> 53; /* 11 bits: SIZE_SLOTS */
        for (unsigned i = 0; i < 16; i++) {
            struct size_slot *s = &r->sizes[(h + i) & (SIZE_SLOTS - 1)];
            if (s->key == key) {
                s->count++;
                return r;
            }
            if (s->key == 0) {
                s->key = key;
                s->count = 1;
                return r;
            }
        }
        r->size_overflow++;
    }
    return r;
}

/* The real function, with counting off while it runs when this call was counted (r): musl's own calloc, memalign,
 * posix_memalign and valloc call malloc or aligned_alloc by their exported names, which lead back here (glibc's call
 * theirs internally). */
#define FORWARD(r, call)                       \
    __extension__({                            \
        int was_busy_ = tls_busy;              \
        if (r)                                 \
            tls_busy = 1;                      \
        __typeof__(call) forwarded_ = (call);  \
        tls_busy = was_busy_;                  \
        forwarded_;                            \
    })

static inline size_t usable(void *p)
{
    return (p && real_usable && !is_boot(p)) ? real_usable(p) : 0;
}

static inline void note_alloc(struct thread_rec *r, void *p)
{
    if (r && p)
        track_live(r, (long long)usable(p), 1);
}

static inline void note_free(struct thread_rec *r, size_t was)
{
    if (r)
        track_live(r, -(long long)was, -1);
}

EXPORT void *malloc(size_t size)
{
    if (!ensure_init())
        return boot_alloc(size, 16);
    struct thread_rec *r = count(F_MALLOC, 1, size);
    void *p = FORWARD(r, real_malloc(size));
    note_alloc(r, p);
    return p;
}

EXPORT void *calloc(size_t n, size_t size)
{
    size_t total;
    if (__builtin_mul_overflow(n, size, &total))
        total = SIZE_MAX;
    if (!ensure_init()) {
        if (total == SIZE_MAX) {
            errno = ENOMEM;
            return NULL;
        }
        return boot_alloc(total, 16); /* static storage is already zero */
    }
    struct thread_rec *r = count(F_CALLOC, 1, total);
    void *p = FORWARD(r, real_calloc(n, size));
    note_alloc(r, p);
    return p;
}

EXPORT void free(void *p)
{
    if (!p || is_boot(p))
        return;
    if (!ensure_init())
        return;
    struct thread_rec *r = count(F_FREE, 0, 0);
    size_t was = r ? usable(p) : 0;
    int was_busy = tls_busy;
    if (r)
        tls_busy = 1; /* as FORWARD: nothing inside is counted */
    real_free(p);
    tls_busy = was_busy;
    note_free(r, was);
}

static void *realloc_common(enum fn_id fn, void *p, size_t size)
{
    if (is_boot(p)) {
        /* A bootstrap block moves to the real allocator; its old size is stored in front of it. */
        size_t old = ((size_t *)p)[-1];
        void *q = malloc(size);
        if (q)
            memcpy(q, p, old < size ? old : size);
        return q;
    }
    struct thread_rec *r = count(fn, 1, size);
    size_t was = (r && p) ? usable(p) : 0;
    void *q = FORWARD(r, real_realloc(p, size));
    if (r) {
        if (q) {
            track_live(r, (long long)usable(q) - (long long)was, p ? 0 : 1);
        } else if (p && size == 0) {
            track_live(r, -(long long)was, -1); /* realloc(p, 0) freed p */
        }
    }
    return q;
}

EXPORT void *realloc(void *p, size_t size)
{
    if (!ensure_init()) {
        void *q = boot_alloc(size, 16);
        if (q && p && is_boot(p)) {
            size_t old = ((size_t *)p)[-1];
            memcpy(q, p, old < size ? old : size);
        }
        return q;
    }
    return realloc_common(F_REALLOC, p, size);
}

EXPORT void *reallocarray(void *p, size_t n, size_t size)
{
    size_t total;
    if (__builtin_mul_overflow(n, size, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    if (!ensure_init())
        return realloc(p, total);
    /* Forwarded as realloc: glibc's reallocarray would call realloc again through us and count twice. */
    return realloc_common(F_REALLOCARRAY, p, total);
}

EXPORT void *aligned_alloc(size_t align, size_t size)
{
    if (!ensure_init())
        return boot_alloc(size, align);
    struct thread_rec *r = count(F_ALIGNED_ALLOC, 1, size);
    void *p = FORWARD(r, real_aligned_alloc(align, size));
    note_alloc(r, p);
    return p;
}

EXPORT int posix_memalign(void **out, size_t align, size_t size)
{
    if (!ensure_init()) {
        *out = boot_alloc(size, align);
        return *out ? 0 : ENOMEM;
    }
    struct thread_rec *r = count(F_POSIX_MEMALIGN, 1, size);
    int rc = FORWARD(r, real_posix_memalign(out, align, size));
    if (rc == 0)
        note_alloc(r, *out);
    return rc;
}

EXPORT void *memalign(size_t align, size_t size)
{
    if (!ensure_init())
        return boot_alloc(size, align);
    struct thread_rec *r = count(F_MEMALIGN, 1, size);
    void *p = FORWARD(r, real_memalign(align, size));
    note_alloc(r, p);
    return p;
}

EXPORT void *valloc(size_t size)
{
    if (!ensure_init())
        return boot_alloc(size, 4096);
    struct thread_rec *r = count(F_VALLOC, 1, size);
    void *p = FORWARD(r, real_valloc(size));
    note_alloc(r, p);
    return p;
}

EXPORT void *pvalloc(size_t size)
{
    if (!ensure_init())
        return boot_alloc((size + 4095) & ~(size_t)4095, 4096);
    struct thread_rec *r = count(F_PVALLOC, 1, size);
    void *p;
    if (real_pvalloc) {
        p = FORWARD(r, real_pvalloc(size));
    } else { /* musl has no pvalloc: glibc's meaning (whole pages, at least one), served by memalign */
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        size_t whole = size ? (size + page - 1) & ~(page - 1) : page;
        p = whole >= size ? FORWARD(r, real_memalign(page, whole)) : NULL;
        if (!p)
            errno = ENOMEM;
    }
    note_alloc(r, p);
    return p;
}

EXPORT size_t malloc_usable_size(void *p)
{
    if (!p)
        return 0;
    if (is_boot(p))
        return ((size_t *)p)[-1];
    if (!ensure_init() || !real_usable)
        return 0;
    return real_usable(p);
}

/* ---- the per-process record (async-signal-safe: see the rules at the top) ---- */

/* The writer's buffers: static, used only by the thread holding record_claim. */
static struct asjson rec_out;
static char rec_exe[PATH_MAX];
static char rec_cmdline[4096];
static char rec_tmp_path[PATH_MAX + 64], rec_path[PATH_MAX + 64];

static size_t read_small_file(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    size_t len = 0;
    while (len < cap) {
        ssize_t n = read(fd, buf + len, cap - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    close(fd);
    return len;
}

/* dst = a + decimal(n) + b, truncated to cap; async-signal-safe. */
static void path_join(char *dst, size_t cap, const char *dir, const char *name, long long pid, uint64_t ns,
                      const char *suffix)
{
    size_t len = 0;
#define APPEND(s)                                                                                                      \
    for (const char *q = (s); *q && len + 1 < cap; q++)                                                                \
        dst[len++] = *q;
    APPEND(dir);
    APPEND("/");
    APPEND(name);
    char digits[24];
    for (int part = 0; part < 2; part++) {
        uint64_t v = part == 0 ? (uint64_t)pid : ns;
        size_t i = sizeof digits - 1;
        digits[i] = 0;
        do {
            digits[--i] = (char)('0' + v % 10);
            v /= 10;
        } while (v);
        APPEND(digits + i);
        if (part == 0)
            APPEND(".");
    }
    APPEND(suffix);
#undef APPEND
    dst[len] = 0;
}

static void out_calls(struct asjson *w, const uint64_t *calls)
{
    asjson_raw(w, "{");
    for (int f = 0; f < F_COUNT; f++) {
        asjson_raw(w, f ? ", \"" : "\"");
        asjson_raw(w, fn_names[f]);
        asjson_raw(w, "\": ");
        asjson_u64(w, calls[f]);
    }
    asjson_raw(w, "}");
}

static void out_thread(struct asjson *w, pid_t tid, int exited, const uint64_t *calls, int first)
{
    asjson_raw(w, first ? "{\"tid\": " : ", {\"tid\": ");
    asjson_i64(w, tid);
    asjson_raw(w, exited ? ", \"exited\": true, \"calls\": " : ", \"exited\": false, \"calls\": ");
    out_calls(w, calls);
    asjson_raw(w, "}");
}

static int out_sizes(struct asjson *w, const struct size_slot *t, unsigned n, int first)
{
    for (unsigned i = 0; i < n; i++) {
        if (!t[i].key || !t[i].count)
            continue;
        asjson_raw(w, first ? "[\"" : ", [\"");
        first = 0;
        asjson_raw(w, fn_names[(t[i].key >> 56) & 0x7f]);
        asjson_raw(w, "\", ");
        asjson_u64(w, t[i].key & ((1ULL << 55) - 1));
        asjson_raw(w, ", ");
        asjson_u64(w, t[i].count);
        asjson_raw(w, "]");
    }
    return first;
}

static uint64_t now_ns(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Takes the record for this thread: returns 1 when it may write, 0 when the record is already written (or being
 * written by this very thread, interrupted by a signal). Waits while another thread writes it. */
static int claim_record(void)
{
    int self = (int)syscall(SYS_gettid);
    for (;;) {
        int expected = 0;
        if (atomic_compare_exchange_strong(&record_claim, &expected, self))
            return 1;
        if (expected == CLAIM_DONE || expected == self)
            return 0;
        /* Another thread is writing (an exit racing an exec or _exit): the process ends with its record, or the
         * claim comes back (exec failed) and this thread writes. */
        sched_yield();
    }
}

/* Writes <trace_dir>/trace.<pid>.<ns>.json (raw: `mallard profile` merges and sorts). Keeps the claim (record
 * written) unless release is set; returns 1 when a record file was written, its path in rec_path. */
static int write_record(const char *ended_by)
{
    /* A vfork child shares our memory: it must neither write our record nor take the claim. */
    if (!trace_dir[0] || !ready() || getpid() != my_pid)
        return 0;
    if (!claim_record())
        return 0;
    int saved_errno = errno;
    int was_busy = tls_busy;
    tls_busy = 1;
    uint64_t elapsed = now_ns(CLOCK_MONOTONIC) - ((uint64_t)t_start.tv_sec * 1000000000u + (uint64_t)t_start.tv_nsec);
    if (tls_rec)
        publish(tls_rec);
    /* Other threads' unpublished deltas are added now, so the final live count is exact. */
    long long final_bytes = atomic_load(&live_bytes), final_objects = atomic_load(&live_objects);
    uint64_t calls[F_COUNT], hist[HIST_BUCKETS], overflow = retired_overflow;
    memcpy(calls, retired_calls, sizeof calls);
    memcpy(hist, retired_hist, sizeof hist);
    size_t nret = atomic_load(&n_retired);
    struct retired_thread *ret = atomic_load(&retired);
    unsigned long long nthreads = nret, walked = 0;
    struct thread_rec *head = atomic_load(&recs);
    for (struct thread_rec *r = head; r && walked < MAX_LIST_WALK; r = r->next, walked++) {
        if (atomic_load_explicit(&r->state, memory_order_relaxed) != REC_LIVE)
            continue;
        nthreads++;
        final_bytes += r->delta_bytes;
        final_objects += r->delta_objects;
        for (int f = 0; f < F_COUNT; f++)
            calls[f] += r->calls[f];
        for (int h = 0; h < HIST_BUCKETS; h++)
            hist[h] += r->hist[h];
        overflow += r->size_overflow;
    }

    ssize_t en = readlink("/proc/self/exe", rec_exe, sizeof rec_exe - 1);
    rec_exe[en > 0 ? en : 0] = 0;
    size_t cn = read_small_file("/proc/self/cmdline", rec_cmdline, sizeof rec_cmdline);
    while (cn > 0 && rec_cmdline[cn - 1] == 0)
        cn--;

    /* Written under a temporary name and renamed once complete: a reader never sees half a record. */
    uint64_t wall = now_ns(CLOCK_REALTIME);
    path_join(rec_tmp_path, sizeof rec_tmp_path, trace_dir, ".partial.", getpid(), wall, ".json");
    path_join(rec_path, sizeof rec_path, trace_dir, "trace.", getpid(), wall, ".json");
    int fd = open(rec_tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    int ok = 0;
    if (fd >= 0) {
        struct asjson *w = &rec_out;
        asjson_init(w, fd);
        asjson_raw(w, "{\"format\": \"raw\", \"pid\": ");
        asjson_i64(w, getpid());
        asjson_raw(w, ", \"ppid\": ");
        asjson_i64(w, getppid());
        asjson_raw(w, ", \"ended_by\": \"");
        asjson_raw(w, ended_by);
        asjson_raw(w, "\", \"exe\": ");
        asjson_string(w, rec_exe, strlen(rec_exe));
        asjson_raw(w, ", \"cmdline\": ");
        asjson_string(w, rec_cmdline, cn);
        asjson_raw(w, ", \"elapsed_s\": ");
        asjson_fixed9(w, elapsed);
        asjson_raw(w, ", \"calls\": ");
        out_calls(w, calls);
        asjson_raw(w, ", \"histogram_log2\": [");
        for (int h = 0; h < HIST_BUCKETS; h++) {
            if (h)
                asjson_raw(w, ", ");
            asjson_u64(w, hist[h]);
        }
        /* Every (function, size, calls) entry, unsorted and possibly repeated across threads. */
        asjson_raw(w, "], \"sizes\": [");
        int first = 1;
        if (retired_sizes)
            first = out_sizes(w, retired_sizes, MERGE_SLOTS, first);
        walked = 0;
        for (struct thread_rec *r = head; r && walked < MAX_LIST_WALK; r = r->next, walked++)
            if (atomic_load_explicit(&r->state, memory_order_relaxed) == REC_LIVE)
                first = out_sizes(w, r->sizes, SIZE_SLOTS, first);
        asjson_raw(w, "], \"sizes_not_tabled\": ");
        asjson_u64(w, overflow);
        asjson_raw(w, ", \"threads\": [");
        first = 1;
        unsigned long long listed = 0;
        walked = 0;
        for (struct thread_rec *r = head; r && walked < MAX_LIST_WALK && listed < MAX_THREADS_LISTED;
             r = r->next, walked++) {
            if (atomic_load_explicit(&r->state, memory_order_relaxed) != REC_LIVE)
                continue;
            out_thread(w, r->tid, 0, r->calls, first);
            first = 0;
            listed++;
        }
        for (size_t i = 0; ret && i < nret && listed < MAX_THREADS_LISTED; i++, listed++) {
            out_thread(w, ret[i].tid, 1, ret[i].calls, first);
            first = 0;
        }
        long long pb = atomic_load(&peak_bytes), po = atomic_load(&peak_objects);
        asjson_raw(w, "], \"peak_live_bytes\": ");
        asjson_i64(w, pb > final_bytes ? pb : final_bytes);
        asjson_raw(w, ", \"peak_live_objects\": ");
        asjson_i64(w, po > final_objects ? po : final_objects);
        asjson_raw(w, ", \"live_bytes_at_end\": ");
        asjson_i64(w, final_bytes);
        asjson_raw(w, ", \"live_objects_at_end\": ");
        asjson_i64(w, final_objects);
        asjson_raw(w, ", \"live_bytes_kind\": \"usable\", \"peak_tolerance_bytes_per_thread\": ");
        asjson_i64(w, FLUSH_BYTES);
        asjson_raw(w, ", \"threads_seen\": ");
        asjson_u64(w, nthreads);
        asjson_raw(w, ", \"threads_not_listed\": ");
        asjson_u64(w, nthreads - listed);
        asjson_raw(w, "}\n");
        ok = asjson_flush(w) == 0;
        close(fd);
        if (ok && rename(rec_tmp_path, rec_path) != 0)
            ok = 0;
        if (!ok)
            unlink(rec_tmp_path);
    }
    atomic_store(&record_claim, CLAIM_DONE);
    tls_busy = was_busy;
    errno = saved_errno;
    return ok;
}

/* In a forked child only the forking thread exists: its calls start from zero, one record per process. The live
 * blocks it inherits are still live, so the live counts carry over (freeing them must not go negative). */
static void reset_in_child(void)
{
    pthread_mutex_init(&fold_lock, NULL);
    struct thread_rec *keep = tls_rec;
    long long inherited_bytes = atomic_load(&live_bytes), inherited_objects = atomic_load(&live_objects);
    unsigned walked = 0;
    for (struct thread_rec *r = atomic_load(&recs); r && walked < MAX_LIST_WALK; r = r->next, walked++) {
        if (atomic_load(&r->state) == REC_LIVE) {
            inherited_bytes += r->delta_bytes;
            inherited_objects += r->delta_objects;
        }
        clear_counts(r);
        /* The other threads do not exist here: their records are free for new threads. */
        atomic_store(&r->state, r == keep ? REC_LIVE : REC_FREE);
    }
    if (keep)
        keep->tid = (pid_t)syscall(SYS_gettid);
    memset(retired_calls, 0, sizeof retired_calls);
    memset(retired_hist, 0, sizeof retired_hist);
    retired_overflow = 0;
    if (retired_sizes)
        memset(retired_sizes, 0, MERGE_SLOTS * sizeof(struct size_slot));
    atomic_store(&n_retired, 0);
    atomic_store(&live_bytes, inherited_bytes);
    atomic_store(&live_objects, inherited_objects);
    atomic_store(&peak_bytes, inherited_bytes);
    atomic_store(&peak_objects, inherited_objects);
    clock_gettime(CLOCK_MONOTONIC, &t_start);
    my_pid = getpid();
    atomic_store(&record_claim, 0);
}

__attribute__((constructor)) static void tracer_init(void)
{
    ensure_init();
    tls_busy = 1;
    const char *dir = getenv("MALLARD_TRACE_DIR");
    if (dir && strlen(dir) < sizeof trace_dir)
        strcpy(trace_dir, dir);
    if (pthread_key_create(&exit_key, thread_exit_cb) == 0)
        have_key = 1;
    if (tls_rec && have_key)
        pthread_setspecific(exit_key, tls_rec);
    pthread_atfork(NULL, NULL, reset_in_child);
    my_pid = getpid();
    tls_busy = 0;
}

__attribute__((destructor)) static void tracer_fini(void)
{
    write_record("exit");
}

/* ---- process image ends: exec, _exit, _Exit and quick_exit write the record first ---- */

static int record_before_exec(void)
{
    return write_record("exec");
}

static void exec_failed(int wrote)
{
    /* The image goes on: drop the record just written and give the claim back; counting continues. */
    int e = errno;
    if (wrote)
        unlink(rec_path);
    if (getpid() == my_pid)
        atomic_store(&record_claim, 0);
    errno = e;
}

EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
    if (!ready())
        return (int)syscall(SYS_execve, path, argv, envp);
    int wrote = record_before_exec();
    int rc = real_execve(path, argv, envp);
    exec_failed(wrote);
    return rc;
}

EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
    if (!ready()) {
        errno = EAGAIN;
        return -1;
    }
    int wrote = record_before_exec();
    int rc = real_execvpe(file, argv, envp);
    exec_failed(wrote);
    return rc;
}

EXPORT int execv(const char *path, char *const argv[])
{
    return execve(path, argv, environ);
}

EXPORT int execvp(const char *file, char *const argv[])
{
    return execvpe(file, argv, environ);
}

EXPORT int fexecve(int fd, char *const argv[], char *const envp[])
{
    if (!ready()) {
        errno = EAGAIN;
        return -1;
    }
    int wrote = record_before_exec();
    int rc = real_fexecve(fd, argv, envp);
    exec_failed(wrote);
    return rc;
}

/* The execl family: the variadic arguments are counted, then copied into an argv on the stack when few (the
 * common case) or into mapped pages (never a large stack frame: a thread's stack may be 16 KiB). */
#define SMALL_ARGV 32

/* Arguments after first up to and including the terminating NULL. */
static size_t count_args(const char *first, va_list ap)
{
    size_t n = 0;
    if (!first)
        return 0;
    while (va_arg(ap, char *) != NULL)
        n++;
    return n + 1;
}

enum execl_kind { EXECL, EXECLP, EXECLE };

static int execl_common(enum execl_kind kind, const char *path, const char *arg, va_list ap)
{
    va_list counting;
    va_copy(counting, ap);
    size_t n = count_args(arg, counting); /* argv[1..n], argv[n] == NULL */
    va_end(counting);
    char *small[SMALL_ARGV];
    char **argv = small;
    size_t mapped = 0;
    if (n + 1 > SMALL_ARGV) {
        mapped = (n + 1) * sizeof *argv;
        argv = map_pages(mapped);
        if (!argv) {
            errno = ENOMEM;
            return -1;
        }
    }
    argv[0] = (char *)arg;
    for (size_t i = 1; i <= n; i++)
        argv[i] = va_arg(ap, char *);
    char *const *envp = kind == EXECLE ? va_arg(ap, char *const *) : environ;
    int rc = kind == EXECLP ? execvpe(path, argv, envp) : execve(path, argv, envp);
    if (mapped) {
        int e = errno;
        munmap(argv, mapped);
        errno = e;
    }
    return rc;
}

EXPORT int execl(const char *path, const char *arg, ...)
{
    va_list ap;
    va_start(ap, arg);
    int rc = execl_common(EXECL, path, arg, ap);
    va_end(ap);
    return rc;
}

EXPORT int execlp(const char *file, const char *arg, ...)
{
    va_list ap;
    va_start(ap, arg);
    int rc = execl_common(EXECLP, file, arg, ap);
    va_end(ap);
    return rc;
}

EXPORT int execle(const char *path, const char *arg, ...)
{
    va_list ap;
    va_start(ap, arg);
    int rc = execl_common(EXECLE, path, arg, ap);
    va_end(ap);
    return rc;
}

EXPORT void _exit(int status)
{
    if (!ready())
        syscall(SYS_exit_group, status);
    write_record("_exit");
    real__exit(status);
}

EXPORT void _Exit(int status)
{
    if (!ready())
        syscall(SYS_exit_group, status);
    write_record("_Exit");
    (real__Exit ? real__Exit : real__exit)(status);
}

EXPORT void quick_exit(int status)
{
    if (!ready())
        syscall(SYS_exit_group, status);
    /* at_quick_exit handlers run after the record: the counts of the program itself are complete. */
    write_record("quick_exit");
    real_quick_exit(status);
}
