/* Allocation workload compiled by gcc under LD_PRELOAD=libmallard.so: churn, realloc growth, aligned blocks, cross-thread frees. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHURN_ITERS 200000
#define RING 1024
#define THREADS 4
#define PER_THREAD 20000

static int fail(const char *what, unsigned long i) {
    fprintf(stderr, "alloc_churn: %s at %lu\n", what, i);
    exit(1);
}

/* Block size of iteration i; the test recomputes the same formula for its expected totals. */
static size_t churn_size(unsigned long i) { return 1 + (i * 7919UL) % 5000; }

static unsigned long long churn(void) {
    unsigned char *ring[RING] = {0};
    size_t sizes[RING] = {0};
    unsigned long long bytes = 0;
    for (unsigned long i = 0; i < CHURN_ITERS; i++) {
        unsigned slot = (unsigned)(i % RING);
        if (ring[slot]) {
            /* The evicted block still holds the byte pattern it was given. */
            if (ring[slot][0] != (unsigned char)(i - RING) || ring[slot][sizes[slot] - 1] != (unsigned char)(i - RING))
                fail("corrupted block", i);
            free(ring[slot]);
        }
        size_t n = churn_size(i);
        ring[slot] = malloc(n);
        if (!ring[slot]) fail("malloc", i);
        memset(ring[slot], (int)(i & 0xff), n);
        sizes[slot] = n;
        bytes += n;
    }
    for (unsigned i = 0; i < RING; i++) free(ring[i]);
    return bytes;
}

static size_t grow(void) {
    char *s = NULL;
    size_t len = 0;
    for (unsigned long i = 0; len < (4u << 20); i++) {
        size_t add = 1 + i % 97;
        char *t = realloc(s, len + add);
        if (!t) fail("realloc", i);
        s = t;
        memset(s + len, 'a' + (int)(i % 26), add);
        len += add;
    }
    /* Contents survived every move: recheck the pattern from the start. */
    size_t pos = 0;
    for (unsigned long i = 0; pos < len; i++) {
        size_t add = 1 + i % 97;
        for (size_t k = 0; k < add && pos < len; k++, pos++)
            if (s[pos] != 'a' + (int)(i % 26)) fail("realloc lost data", pos);
    }
    free(s);
    return len;
}

static int aligned(void) {
    int count = 0;
    for (size_t align = 16; align <= 65536; align *= 2) {
        void *p = NULL;
        if (posix_memalign(&p, align, align * 3 + 1) != 0) fail("posix_memalign", align);
        if ((uintptr_t)p % align) fail("misaligned posix_memalign", align);
        void *q = aligned_alloc(align, align * 2);
        if (!q || (uintptr_t)q % align) fail("misaligned aligned_alloc", align);
        memset(p, 1, align * 3 + 1);
        memset(q, 2, align * 2);
        free(p);
        free(q);
        count++;
    }
    return count;
}

struct handoff {
    void *blocks[PER_THREAD];
    unsigned id;
};

static void *producer(void *arg) {
    struct handoff *h = arg;
    for (unsigned i = 0; i < PER_THREAD; i++) {
        size_t n = 16 + (i * 31u + h->id) % 2000;
        unsigned char *b = malloc(n);
        if (!b) fail("thread malloc", i);
        b[0] = (unsigned char)h->id;
        h->blocks[i] = b;
    }
    return NULL;
}

static unsigned long cross_thread(void) {
    static struct handoff hs[THREADS];
    pthread_t t[THREADS];
    unsigned long freed = 0;
    for (unsigned k = 0; k < THREADS; k++) {
        hs[k].id = k;
        if (pthread_create(&t[k], NULL, producer, &hs[k])) fail("pthread_create", k);
    }
    for (unsigned k = 0; k < THREADS; k++) {
        pthread_join(t[k], NULL);
        /* Blocks made by an exited thread are freed by the main thread. */
        for (unsigned i = 0; i < PER_THREAD; i++) {
            if (((unsigned char *)hs[k].blocks[i])[0] != k) fail("cross-thread block", i);
            free(hs[k].blocks[i]);
            freed++;
        }
    }
    return freed;
}

int main(void) {
    unsigned long long bytes = churn();
    size_t grown = grow();
    int aligned_ok = aligned();
    unsigned long freed = cross_thread();
    printf("churn_bytes=%llu grown=%zu aligned=%d cross_freed=%lu\n", bytes, grown, aligned_ok, freed);
    return 0;
}
