/* tracer_cases.c: programs that stress the tracer's exit and exec paths (signal handlers, small stacks, fork, races). */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *mode;

/* The handler leaves the process from inside whatever malloc/free the main loop was running. */
static void on_alarm(int sig)
{
    (void)sig;
    if (!strcmp(mode, "sigexec")) {
        char *const argv[] = {"true", NULL};
        execve("/bin/true", argv, environ);
    }
    _exit(0);
}

static void *sleeper(void *arg)
{
    (void)arg;
    pause();
    return NULL;
}

static void churn_until_signal(void)
{
    /* A second thread makes glibc's malloc take its arena lock (a single-threaded process skips it). */
    pthread_t t;
    pthread_create(&t, NULL, sleeper, NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, 0}, {0, 20000 + (getpid() % 7) * 3000}};
    setitimer(ITIMER_REAL, &it, NULL);
    void *keep[64] = {0};
    for (unsigned i = 0;; i++) {
        unsigned k = i % 64;
        free(keep[k]);
        keep[k] = malloc(16 + (i * 2654435761u) % 4000);
    }
}

/* A thread with a tiny stack forks; the child execs (through execl, the variadic wrapper). */
static void *small_stack_thread(void *arg)
{
    (void)arg;
    pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/true", "true", (char *)NULL);
        _exit(99);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return (void *)(long)(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
}

static int small_stack(size_t stack)
{
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    if (pthread_attr_setstacksize(&attr, stack) != 0)
        return 2;
    pthread_t t;
    if (pthread_create(&t, &attr, small_stack_thread, NULL) != 0)
        return 3;
    void *rc;
    pthread_join(t, &rc);
    return (int)(long)rc;
}

static pthread_barrier_t barrier;

static void *racer(void *arg)
{
    (void)arg;
    pthread_barrier_wait(&barrier);
    if (!strcmp(mode, "race-exec")) {
        char *const argv[] = {"true", NULL};
        execve("/bin/true", argv, environ);
    }
    _exit(0);
    return NULL;
}

int main(int argc, char **argv)
{
    mode = argc > 1 ? argv[1] : "";
    void *volatile blocks[10];
    for (int i = 0; i < 10; i++) {
        blocks[i] = malloc(100000);
        memset(blocks[i], 1, 100000);
    }
    if (!strcmp(mode, "sigexit") || !strcmp(mode, "sigexec"))
        churn_until_signal();
    if (!strcmp(mode, "smallstack"))
        return small_stack(argc > 2 ? (size_t)atol(argv[2]) : 32768);
    if (!strcmp(mode, "fork")) {
        pid_t pid = fork();
        if (pid == 0) { /* the child frees what the parent allocated */
            for (int i = 0; i < 10; i++)
                free(blocks[i]);
            return 0;
        }
        int status;
        waitpid(pid, &status, 0);
        return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    }
    if (!strcmp(mode, "_Exit"))
        _Exit(0);
    if (!strcmp(mode, "quick_exit"))
        quick_exit(0);
    if (!strcmp(mode, "race-exit") || !strcmp(mode, "race-exec")) {
        pthread_barrier_init(&barrier, NULL, 2);
        pthread_t t;
        pthread_create(&t, NULL, racer, NULL);
        pthread_barrier_wait(&barrier);
        exit(0);
    }
    fprintf(stderr, "usage: tracer_cases sigexit|sigexec|smallstack [BYTES]|fork|_Exit|quick_exit|race-exit|race-exec\n");
    return 2;
}
