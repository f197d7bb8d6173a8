/* Test program: one malloc(777) before main, then 10 threads that each call malloc(8) and stay alive until told to end. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define THREADS 10

static void *early;
static pthread_barrier_t started;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t done = PTHREAD_COND_INITIALIZER;
static int finish;

__attribute__((constructor)) static void before_main(void)
{
    early = malloc(777); /* an allocation before main: the profiler must see it */
}

static void *worker(void *arg)
{
    volatile char *p = malloc(8);
    (void)arg;
    if (!p)
        abort();
    p[0] = 1;
    pthread_barrier_wait(&started);
    pthread_mutex_lock(&lock);
    while (!finish)
        pthread_cond_wait(&done, &lock);
    pthread_mutex_unlock(&lock);
    free((void *)p);
    return NULL;
}

int main(int argc, char **argv)
{
    /* argv[1]: seconds to stay alive after the threads have started (default 30). */
    int hold = argc > 1 ? atoi(argv[1]) : 30;
    pthread_t t[THREADS];
    pthread_barrier_init(&started, NULL, THREADS + 1);
    for (int i = 0; i < THREADS; i++)
        if (pthread_create(&t[i], NULL, worker, NULL) != 0)
            return 1;
    pthread_barrier_wait(&started);
    printf("ready: %d threads each called malloc(8)\n", THREADS);
    fflush(stdout);
    sleep((unsigned)hold);
    pthread_mutex_lock(&lock);
    finish = 1;
    pthread_cond_broadcast(&done);
    pthread_mutex_unlock(&lock);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    free(early);
    return 0;
}
