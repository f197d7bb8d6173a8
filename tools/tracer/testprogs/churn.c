/* Test program: an allocation-heavy workload (malloc/free of mixed small sizes with a live working set) in N threads. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SLOTS 4096 /* live working set per thread */

static long rounds;

static void *worker(void *arg)
{
    uint64_t x = 0x9E3779B97F4A7C15ULL ^ (uintptr_t)arg;
    void **slot = calloc(SLOTS, sizeof *slot);
    if (!slot)
        abort();
    for (long i = 0; i < rounds; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17; /* xorshift64 */
        unsigned k = (unsigned)(x % SLOTS);
        free(slot[k]);
        size_t size = 8 + (size_t)((x >> 20) % 512);
        slot[k] = malloc(size);
        if (!slot[k])
            abort();
        memset(slot[k], 1, 8);
    }
    for (unsigned k = 0; k < SLOTS; k++)
        free(slot[k]);
    free(slot);
    return NULL;
}

int main(int argc, char **argv)
{
    /* argv[1]: threads (default 2); argv[2]: malloc/free pairs per thread (default 2000000). */
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    rounds = argc > 2 ? atol(argv[2]) : 2000000;
    if (threads < 1 || threads > 256 || rounds < 1)
        return 2;
    pthread_t t[256];
    for (int i = 0; i < threads; i++)
        if (pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)(i + 1)) != 0)
            return 1;
    for (int i = 0; i < threads; i++)
        pthread_join(t[i], NULL);
    printf("churn: %d threads x %ld malloc/free pairs\n", threads, rounds);
    return 0;
}
