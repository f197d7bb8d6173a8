/* Test program: exactly 1000 malloc(8225) and 500 realloc(..., 16450) calls spread over 4 threads. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define THREADS 4
#define MALLOCS_PER_THREAD 250 /* 4 x 250 = 1000 */
#define REALLOCS_PER_THREAD 125 /* 4 x 125 = 500 */

static void *worker(void *arg)
{
    void *blocks[MALLOCS_PER_THREAD];
    (void)arg;
    for (int i = 0; i < MALLOCS_PER_THREAD; i++) {
        blocks[i] = malloc(8225);
        if (!blocks[i])
            abort();
        memset(blocks[i], i, 8225);
    }
    for (int i = 0; i < REALLOCS_PER_THREAD; i++) {
        void *q = realloc(blocks[i], 16450);
        if (!q)
            abort();
        blocks[i] = q;
    }
    for (int i = 0; i < MALLOCS_PER_THREAD; i++)
        free(blocks[i]);
    return NULL;
}

int main(void)
{
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        if (pthread_create(&t[i], NULL, worker, NULL) != 0)
            return 1;
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    puts("done: 1000 malloc(8225), 500 realloc(16450) in 4 threads");
    return 0;
}
