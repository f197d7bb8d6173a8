/* Interposing malloc tracer of `mallard profile`: counts calls, sizes and live bytes per thread, writes one JSON record per process. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
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

#define EXPORT __attribute__((visibility("default")))

enum fn_id { F_MALLOC, F_CALLOC, F_REALLOC, F_FREE, F_ALIGNED_ALLOC, F_POSIX_MEMALIGN, F_MEMALIGN,
             F_VALLOC, F_PVALLOC, F_REALLOCARRAY, F_COUNT };
static const char *const fn_names[F_COUNT] = {"malloc", "calloc", "realloc", "free", "aligned_alloc",
                                              "posix_memalign", "memalign", "valloc", "pvalloc", "reallocarray"};

#define HIST_BUCKETS 65       /* bucket 0: size 0; bucket b: sizes in [2^(b-1), 2^b) */
#define SIZE_SLOTS 2048       /* per-thread open-addressing table of (function, exact size) -> calls; power of two */
#define FLUSH_BYTES (32 << 10) /* a thread publishes its live-bytes delta once it exceeds this ... */
#define MERGE_SLOTS (1u << 16) /* process-wide (function, size) tables: exited threads' and the exit writer's */
#define TOP_SIZES 200          /* sizes written to the record */
#define FLUSH_OBJECTS 64      /* ... or this many objects, so peaks are exact to within these per thread */

struct size_slot {
    uint64_t key; /* (function << 56) | size, 0 = empty (size 0 is stored as key 1<<55 | fn) */
    uint64_t count;
};

/* One thread's counters; written only by its owner, read by the exit writer (racy reads are tolerated). */
struct thread_rec {
    struct thread_rec *next; /* in the process's list of records */
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

/* 0: nothing resolved; 1: a thread is resolving (others spin, the resolver uses the bootstrap buffer); 2: ready. */
static atomic_int init_state;
static __thread int tls_resolving;
static __thread int tls_busy; /* inside the tracer: calls are forwarded uncounted */
static __thread struct thread_rec *tls_rec __attribute__((tls_model("initial-exec")));

/* Bootstrap buffer for calls made while dlsym runs; its blocks are never freed. */
static char boot_buf[64 << 10] __attribute__((aligned(64)));
static atomic_size_t boot_used;

static pthread_mutex_t recs_lock = PTHREAD_MUTEX_INITIALIZER; /* guards the list, never taken on the hot path */
static struct thread_rec *recs;      /* records of the live threads */
static struct thread_rec *free_recs; /* records of exited threads, reused by new threads (thread churn stays bounded) */

/* Exited threads: their counts are folded into these aggregates, their per-thread totals kept compactly. */
struct retired_thread {
    pid_t tid;
    uint64_t calls[F_COUNT];
};
static uint64_t retired_calls[F_COUNT], retired_hist[HIST_BUCKETS], retired_overflow;
static struct size_slot *retired_sizes; /* MERGE_SLOTS entries, mapped on first use */
static struct retired_thread *retired;
static size_t n_retired, cap_retired;
static pthread_key_t exit_key;
static int have_key;

static atomic_llong live_bytes, live_objects, peak_bytes, peak_objects;
static struct timespec t_start;
static char trace_dir[PATH_MAX];
static int record_written;
static pid_t my_pid;

static int is_boot(const void *p)
{
    return (const char *)p >= boot_buf && (const char *)p < boot_buf + sizeof boot_buf;
}

static void *boot_alloc(size_t size, size_t align)
{
    if (align < 16)
        align = 16;
    size_t hdr = align; /* room for the 8-byte size in front of the block, keeping the alignment */
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

static void *map_pages(size_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void publish(struct thread_rec *r);

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

/* Folds an exited thread's record into the process aggregates. Called with recs_lock held. */
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
    /* A thread that allocates again in a later TLS destructor comes back here: one entry per tid. */
    if (n_retired > 0 && retired[n_retired - 1].tid == r->tid) {
        for (int f = 0; f < F_COUNT; f++)
            retired[n_retired - 1].calls[f] += r->calls[f];
        return;
    }
    if (n_retired == cap_retired) {
        size_t cap = cap_retired ? 2 * cap_retired : 256;
        struct retired_thread *grown = map_pages(cap * sizeof *grown);
        if (!grown)
            return;
        if (retired) {
            memcpy(grown, retired, n_retired * sizeof *grown);
            munmap(retired, cap_retired * sizeof *grown);
        }
        retired = grown;
        cap_retired = cap;
    }
    retired[n_retired].tid = r->tid;
    memcpy(retired[n_retired].calls, r->calls, sizeof r->calls);
    n_retired++;
}

static void thread_exit_cb(void *arg)
{
    struct thread_rec *r = arg;
    /* The thread is gone: its counts move to the aggregates and its record is recycled. */
    if (tls_rec == r)
        tls_rec = NULL;
    int was_busy = tls_busy;
    tls_busy = 1;
    pthread_mutex_lock(&recs_lock);
    publish(r);
    fold_retired(r);
    for (struct thread_rec **pp = &recs; *pp; pp = &(*pp)->next)
        if (*pp == r) {
            *pp = r->next;
            break;
        }
    r->next = free_recs;
    free_recs = r;
    pthread_mutex_unlock(&recs_lock);
    tls_busy = was_busy;
}

static struct thread_rec *new_rec(void)
{
    tls_busy = 1;
    pthread_mutex_lock(&recs_lock);
    struct thread_rec *r = free_recs;
    if (r) {
        free_recs = r->next;
        memset(r, 0, sizeof *r);
    } else {
        r = map_pages(sizeof *r);
    }
    if (r) {
        r->tid = (pid_t)syscall(SYS_gettid);
        r->next = recs;
        recs = r;
    }
    pthread_mutex_unlock(&recs_lock);
    if (r && have_key)
        pthread_setspecific(exit_key, r);
    tls_rec = r;
    tls_busy = 0;
    return r;
}

static inline unsigned bucket_of(size_t size)
{
    return size == 0 ? 0 : 64 - (unsigned)__builtin_clzll((unsigned long long)size);
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
    void *p = real_malloc(size);
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
    void *p = real_calloc(n, size);
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
    real_free(p);
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
    void *q = real_realloc(p, size);
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
    void *p = real_aligned_alloc(align, size);
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
    int rc = real_posix_memalign(out, align, size);
    if (rc == 0)
        note_alloc(r, *out);
    return rc;
}

EXPORT void *memalign(size_t align, size_t size)
{
    if (!ensure_init())
        return boot_alloc(size, align);
    struct thread_rec *r = count(F_MEMALIGN, 1, size);
    void *p = real_memalign(align, size);
    note_alloc(r, p);
    return p;
}

EXPORT void *valloc(size_t size)
{
    if (!ensure_init())
        return boot_alloc(size, 4096);
    struct thread_rec *r = count(F_VALLOC, 1, size);
    void *p = real_valloc(size);
    note_alloc(r, p);
    return p;
}

EXPORT void *pvalloc(size_t size)
{
    if (!ensure_init())
        return boot_alloc((size + 4095) & ~(size_t)4095, 4096);
    struct thread_rec *r = count(F_PVALLOC, 1, size);
    void *p = real_pvalloc(size);
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

/* ---- the per-process record ---- */

struct out_buf {
    char *p;
    size_t len, cap;
};

static void out(struct out_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void out(struct out_buf *b, const char *fmt, ...)
{
    if (b->len >= b->cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if (n > 0)
        b->len += (size_t)n < b->cap - b->len ? (size_t)n : b->cap - b->len;
}

static void out_json_string(struct out_buf *b, const char *s, size_t n)
{
    out(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            out(b, "\\%c", c);
        else if (c < 0x20 || c >= 0x7f)
            out(b, "\\u%04x", c == 0 ? ' ' : c);
        else
            out(b, "%c", c);
    }
    out(b, "\"");
}

static size_t read_small_file(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, cap);
    close(fd);
    return n > 0 ? (size_t)n : 0;
}

static int cmp_slot_desc(const void *a, const void *b)
{
    const struct size_slot *x = a, *y = b;
    return x->count < y->count ? 1 : x->count > y->count ? -1 : 0;
}


#define MAX_THREADS_LISTED 4096 /* threads written one by one; all of them are in the totals */

static uint64_t total_of(const uint64_t *calls)
{
    uint64_t t = 0;
    for (int f = 0; f < F_COUNT; f++)
        t += calls[f];
    return t;
}

static int cmp_retired_desc(const void *a, const void *b)
{
    uint64_t x = total_of(((const struct retired_thread *)a)->calls);
    uint64_t y = total_of(((const struct retired_thread *)b)->calls);
    return x < y ? 1 : x > y ? -1 : 0;
}

static void out_thread(struct out_buf *b, pid_t tid, int exited, const uint64_t *calls, int first)
{
    out(b, "%s{\"tid\": %d, \"exited\": %s, \"calls\": %llu, \"by_function\": {", first ? "" : ", ", (int)tid,
        exited ? "true" : "false", (unsigned long long)total_of(calls));
    int ff = 1;
    for (int f = 0; f < F_COUNT; f++)
        if (calls[f]) {
            out(b, "%s\"%s\": %llu", ff ? "" : ", ", fn_names[f], (unsigned long long)calls[f]);
            ff = 0;
        }
    out(b, "}}");
}

/* Writes <trace_dir>/trace.<pid>.<time>.json; ended_by says how the process (image) ended. Returns the file's path in path_out. */
static void write_record(const char *ended_by, char *path_out, size_t path_cap)
{
    /* A vfork child shares our memory: it must neither write our record nor mark it written. */
    if (!trace_dir[0] || record_written || atomic_load(&init_state) != 2 || getpid() != my_pid)
        return;
    int saved_errno = errno;
    tls_busy = 1;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    double elapsed = (double)(now.tv_sec - t_start.tv_sec) + (double)(now.tv_nsec - t_start.tv_nsec) / 1e9;

    pthread_mutex_lock(&recs_lock);
    if (tls_rec)
        publish(tls_rec);
    /* Other threads' unpublished deltas are added now, so the final live count is exact. */
    long long final_bytes = atomic_load(&live_bytes), final_objects = atomic_load(&live_objects);
    for (struct thread_rec *r = recs; r; r = r->next) {
        final_bytes += r->delta_bytes;
        final_objects += r->delta_objects;
    }
    size_t merge_size = MERGE_SLOTS * sizeof(struct size_slot);
    struct size_slot *merged = map_pages(merge_size);
    size_t buf_cap = 4 << 20;
    struct out_buf b = {map_pages(buf_cap), 0, buf_cap};
    if (!merged || !b.p) {
        pthread_mutex_unlock(&recs_lock);
        tls_busy = 0;
        errno = saved_errno;
        return;
    }
    uint64_t calls[F_COUNT], hist[HIST_BUCKETS], overflow = retired_overflow;
    memcpy(calls, retired_calls, sizeof calls);
    memcpy(hist, retired_hist, sizeof hist);
    if (retired_sizes)
        memcpy(merged, retired_sizes, merge_size);
    unsigned long long nthreads = n_retired;
    for (struct thread_rec *r = recs; r; r = r->next) {
        nthreads++;
        for (int f = 0; f < F_COUNT; f++)
            calls[f] += r->calls[f];
        for (int h = 0; h < HIST_BUCKETS; h++)
            hist[h] += r->hist[h];
        overflow += r->size_overflow;
        for (unsigned i = 0; i < SIZE_SLOTS; i++)
            if (r->sizes[i].key && !merge_slot(merged, r->sizes[i].key, r->sizes[i].count))
                overflow += r->sizes[i].count;
    }
    qsort(merged, MERGE_SLOTS, sizeof *merged, cmp_slot_desc);

    char exe[PATH_MAX];
    ssize_t en = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[en > 0 ? en : 0] = 0;
    char cmdline[4096];
    size_t cn = read_small_file("/proc/self/cmdline", cmdline, sizeof cmdline);
    while (cn > 0 && cmdline[cn - 1] == 0)
        cn--;

    out(&b, "{\"pid\": %d, \"ppid\": %d, \"ended_by\": \"%s\", \"exe\": ", (int)getpid(), (int)getppid(), ended_by);
    out_json_string(&b, exe, strlen(exe));
    out(&b, ", \"cmdline\": ");
    out_json_string(&b, cmdline, cn);
    out(&b, ", \"elapsed_s\": %.6f, \"calls\": {", elapsed);
    for (int f = 0; f < F_COUNT; f++)
        out(&b, "%s\"%s\": %llu", f ? ", " : "", fn_names[f], (unsigned long long)calls[f]);
    out(&b, "}, \"histogram_log2\": [");
    for (int h = 0; h < HIST_BUCKETS; h++)
        out(&b, "%s%llu", h ? ", " : "", (unsigned long long)hist[h]);
    out(&b, "], \"sizes\": [");
    for (unsigned i = 0; i < TOP_SIZES && i < MERGE_SLOTS && merged[i].count; i++)
        out(&b, "%s[\"%s\", %llu, %llu]", i ? ", " : "", fn_names[merged[i].key >> 56],
            (unsigned long long)(merged[i].key & ((1ULL << 55) - 1)), (unsigned long long)merged[i].count);
    unsigned long long distinct = 0;
    for (unsigned i = 0; i < MERGE_SLOTS && merged[i].count; i++)
        distinct++;
    out(&b, "], \"distinct_sizes\": %llu, \"sizes_not_tabled\": %llu, \"threads\": [", distinct,
        (unsigned long long)overflow);
    int first = 1;
    unsigned long long listed = 0;
    for (struct thread_rec *r = recs; r && listed < MAX_THREADS_LISTED; r = r->next, listed++) {
        out_thread(&b, r->tid, 0, r->calls, first);
        first = 0;
    }
    /* Exited threads, busiest first, while the list stays readable. */
    qsort(retired, n_retired, sizeof *retired, cmp_retired_desc);
    for (size_t i = 0; i < n_retired && listed < MAX_THREADS_LISTED; i++, listed++) {
        out_thread(&b, retired[i].tid, 1, retired[i].calls, first);
        first = 0;
    }
    long long pb = atomic_load(&peak_bytes), po = atomic_load(&peak_objects);
    out(&b, "], \"peak_live_bytes\": %lld, \"peak_live_objects\": %lld, \"live_bytes_at_end\": %lld, "
            "\"live_objects_at_end\": %lld, \"live_bytes_kind\": \"usable\", \"peak_tolerance_bytes_per_thread\": %d, "
            "\"threads_seen\": %llu, \"threads_not_listed\": %llu}\n",
        pb > final_bytes ? pb : final_bytes, po > final_objects ? po : final_objects, final_bytes, final_objects,
        FLUSH_BYTES, nthreads, nthreads - listed);
    pthread_mutex_unlock(&recs_lock);

    /* The same pid writes again after exec, so the name carries the time too. */
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/trace.%d.%lld%09ld.json", trace_dir, (int)getpid(), (long long)wall.tv_sec,
             wall.tv_nsec);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
        size_t off = 0;
        while (off < b.len) {
            ssize_t w = write(fd, b.p + off, b.len - off);
            if (w <= 0)
                break;
            off += (size_t)w;
        }
        close(fd);
        if (path_out)
            snprintf(path_out, path_cap, "%s", path);
    }
    munmap(merged, merge_size);
    munmap(b.p, buf_cap);
    record_written = 1;
    tls_busy = 0;
    errno = saved_errno;
}

/* In a forked child only the forking thread exists, and its counts start from zero: one record per process. */
static void reset_in_child(void)
{
    pthread_mutex_init(&recs_lock, NULL);
    /* The other threads' records belong to threads that do not exist here: recycle them. */
    struct thread_rec *keep = tls_rec;
    struct thread_rec *r = recs;
    while (r) {
        struct thread_rec *next = r->next;
        if (r != keep) {
            r->next = free_recs;
            free_recs = r;
        }
        r = next;
    }
    recs = NULL;
    if (keep) {
        memset(keep, 0, sizeof *keep);
        keep->tid = (pid_t)syscall(SYS_gettid);
        recs = keep;
    }
    memset(retired_calls, 0, sizeof retired_calls);
    memset(retired_hist, 0, sizeof retired_hist);
    retired_overflow = 0;
    if (retired_sizes)
        memset(retired_sizes, 0, MERGE_SLOTS * sizeof(struct size_slot));
    n_retired = 0;
    atomic_store(&live_bytes, 0);
    atomic_store(&live_objects, 0);
    atomic_store(&peak_bytes, 0);
    atomic_store(&peak_objects, 0);
    clock_gettime(CLOCK_MONOTONIC, &t_start);
    record_written = 0;
    my_pid = getpid();
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
    write_record("exit", NULL, 0);
}

/* ---- process image ends: exec and _exit write the record first ---- */

static void record_before_exec(char *written, size_t cap)
{
    written[0] = 0;
    ensure_init();
    write_record("exec", written, cap);
}

static void exec_failed(const char *written)
{
    /* The image goes on: drop the record just written, counting continues into the final one. */
    int e = errno;
    if (written[0])
        unlink(written);
    record_written = 0;
    errno = e;
}

EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
    char written[PATH_MAX + 64];
    record_before_exec(written, sizeof written);
    int rc = real_execve(path, argv, envp);
    exec_failed(written);
    return rc;
}

EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
    char written[PATH_MAX + 64];
    record_before_exec(written, sizeof written);
    int rc = real_execvpe(file, argv, envp);
    exec_failed(written);
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
    char written[PATH_MAX + 64];
    record_before_exec(written, sizeof written);
    int rc = real_fexecve(fd, argv, envp);
    exec_failed(written);
    return rc;
}

/* The execl family: collect the variadic arguments into an argv on the stack. */
#define MAX_EXECL_ARGS 4096
#define COLLECT_ARGS(first, ap, argv, n)                                                                              \
    do {                                                                                                               \
        argv[0] = (char *)(first);                                                                                     \
        n = 1;                                                                                                         \
        while (argv[n - 1] && n < MAX_EXECL_ARGS)                                                                      \
            argv[n++] = va_arg(ap, char *);                                                                            \
    } while (0)

EXPORT int execl(const char *path, const char *arg, ...)
{
    char *argv[MAX_EXECL_ARGS];
    size_t n;
    va_list ap;
    va_start(ap, arg);
    COLLECT_ARGS(arg, ap, argv, n);
    va_end(ap);
    if (argv[n - 1]) {
        errno = E2BIG;
        return -1;
    }
    return execve(path, argv, environ);
}

EXPORT int execlp(const char *file, const char *arg, ...)
{
    char *argv[MAX_EXECL_ARGS];
    size_t n;
    va_list ap;
    va_start(ap, arg);
    COLLECT_ARGS(arg, ap, argv, n);
    va_end(ap);
    if (argv[n - 1]) {
        errno = E2BIG;
        return -1;
    }
    return execvpe(file, argv, environ);
}

EXPORT int execle(const char *path, const char *arg, ...)
{
    char *argv[MAX_EXECL_ARGS];
    size_t n;
    va_list ap;
    va_start(ap, arg);
    COLLECT_ARGS(arg, ap, argv, n);
    char *const *envp = va_arg(ap, char *const *);
    va_end(ap);
    if (argv[n - 1]) {
        errno = E2BIG;
        return -1;
    }
    return execve(path, argv, envp);
}

EXPORT void _exit(int status)
{
    ensure_init();
    write_record("_exit", NULL, 0);
    real__exit(status);
}
