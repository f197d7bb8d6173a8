/* live_workload.c: a workload with known allocation counts for `mallard stats/top PID`.
 * hold N1 S1 N2 S2 K KS: keeps N1 blocks of S1 bytes, N2 of S2, K of KS live, says "ready", waits for a line on
 * stdin, then frees them all and exits. With "report", it first writes its own report (mallard_stats_print, found
 * with dlsym) to stdout between "report-begin" and "report-end".
 * steady RATE SIZE: mallocs and frees RATE blocks of SIZE bytes a second (in 10 ms ticks), says "ready", until stdin
 * closes or gets a line.
 * LIVE_NODUMP=1 in the environment: the process makes itself non-dumpable first (the kernel then refuses other
 * processes of its user the reading of its memory). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

static void *keep(size_t n)
{
    void *p = malloc(n);
    if (!p) { perror("malloc"); exit(1); }
    memset(p, 1, n < 4096 ? n : 4096);
    return p;
}

static void out(void *opaque, const char *s)
{
    (void)opaque;
    fputs(s, stdout);
}

static int hold(char **v, int report)
{
    long n[3] = { atol(v[0]), atol(v[2]), atol(v[4]) };
    size_t sz[3] = { (size_t)atol(v[1]), (size_t)atol(v[3]), (size_t)atol(v[5]) };
    void **p[3];
    for (int k = 0; k < 3; k++) {
        p[k] = calloc((size_t)n[k] + 1, sizeof(void *));
        for (long i = 0; i < n[k]; i++) p[k][i] = keep(sz[k]);
    }
    if (report) {
        void (*sp)(void (*)(void *, const char *), void *, const char *) =
            (void (*)(void (*)(void *, const char *), void *, const char *))dlsym(RTLD_DEFAULT, "mallard_stats_print");
        if (!sp) { fprintf(stderr, "mallard_stats_print not found\n"); return 1; }
        printf("report-begin\n");
        sp(out, NULL, "");
        printf("report-end\n");
    }
    printf("ready\n");
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) { /* EOF: exit as well */ }
    for (int k = 0; k < 3; k++) {
        for (long i = 0; i < n[k]; i++) free(p[k][i]);
        free(p[k]);
    }
    return 0;
}

static int steady(long rate, size_t size)
{
    long per_tick = rate / 100;
    printf("ready\n");
    fflush(stdout);
    void **p = calloc((size_t)per_tick + 1, sizeof(void *));
    struct pollfd pf = { 0, POLLIN, 0 };
    for (;;) {
        for (long i = 0; i < per_tick; i++) p[i] = keep(size);
        for (long i = 0; i < per_tick; i++) free(p[i]);
        if (poll(&pf, 1, 10) != 0) break;   /* a line, EOF or an error on stdin: stop */
    }
    free(p);
    return 0;
}

int main(int argc, char **argv)
{
    if (getenv("LIVE_NODUMP") && prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) { perror("prctl"); return 1; }
    if (argc == 8 && !strcmp(argv[1], "hold")) return hold(argv + 2, 0);
    if (argc == 9 && !strcmp(argv[1], "hold") && !strcmp(argv[8], "report")) return hold(argv + 2, 1);
    if (argc == 4 && !strcmp(argv[1], "steady")) return steady(atol(argv[2]), (size_t)atol(argv[3]));
    fprintf(stderr, "usage: live_workload hold N1 S1 N2 S2 K KS [report] | steady RATE SIZE\n");
    return 2;
}
