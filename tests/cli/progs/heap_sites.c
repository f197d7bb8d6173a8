/* Test program of `mallard heap`: known allocation sites (leak, hold, churn) in separate non-inlined functions. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef HEAP_STATIC
/* The static build (no shared library): a local stand-in for heap_lib.c's function. */
__attribute__((noinline)) void *heap_lib_alloc(size_t n) { return malloc(n); }
#else
void *heap_lib_alloc(size_t n);  /* in heap_lib.c, a shared library */
#endif

static void *volatile sink;  /* keeps blocks reachable through an opaque store so that nothing is optimised away */
void **volatile held;        /* hold_site's blocks: reachable, and live at exit */

__attribute__((noinline)) void *leak_site(size_t n) {
    void *p = malloc(n);  /* MARK leak_site */
    if (p) memset(p, 1, n);
    return p;
}

__attribute__((noinline)) void *hold_site(size_t n) {
    void *p = malloc(n);  /* MARK hold_site */
    if (p) memset(p, 2, n);
    return p;
}

__attribute__((noinline)) void churn_site(size_t n) {
    void *p = malloc(n);  /* MARK churn_site */
    sink = p;
    free(p);
}

/* A function with no dynamic symbol (static): a stripped copy keeps no name for it, and must not get a neighbour's. */
__attribute__((noinline)) static void *static_site(size_t n) {
    void *p = malloc(n);  /* MARK static_site */
    sink = p;
    return p;
}

__attribute__((noinline)) void run_all(int leak_blocks, int hold_blocks, int churn_rounds) {
    for (int i = 0; i < leak_blocks; i++) sink = leak_site(10240);
    held = calloc((size_t)hold_blocks + 1, sizeof *held);
    for (int i = 0; held && i < hold_blocks; i++) held[i] = hold_site(65536);
    for (int i = 0; i < churn_rounds; i++) churn_site((size_t)(64 + (i % 61) * 512));
    sink = heap_lib_alloc(4096);
    sink = static_site(512);
}

int main(int argc, char **argv) {
    /* heap_sites [LEAK_BLOCKS HOLD_BLOCKS CHURN_ROUNDS [EXIT_STATUS]]: defaults 1000 blocks of 10 KiB leaked,
     * 800 blocks of 64 KiB (50 MiB) held (reachable) until exit, 20000 short-lived blocks */
    int leak = argc > 1 ? atoi(argv[1]) : 1000, hold = argc > 2 ? atoi(argv[2]) : 800;
    int churn = argc > 3 ? atoi(argv[3]) : 20000, status = argc > 4 ? atoi(argv[4]) : 0;
    run_all(leak, hold, churn);
    printf("heap_sites done\n");
    return status;
}
