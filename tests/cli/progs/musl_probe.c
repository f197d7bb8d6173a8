/* musl_probe.c: the program of test_cli_musl.py (built with musl-gcc): says whether Mallard serves malloc, waits. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef OWN_MALLOC
/* A bump allocator of its own (never frees): a static program with neither musl's malloc nor Mallard in it. */
static char arena[1 << 20];
static size_t used;

void *malloc(size_t n) {
    size_t at = (used + 15) & ~(size_t)15;
    if (n > sizeof arena - at) return NULL;
    used = at + n;
    return arena + at;
}
void free(void *p) { (void)p; }
void *calloc(size_t a, size_t b) { return malloc(a * b); } /* arena is zeroed and never reused */
void *realloc(void *p, size_t n) {
    void *q = malloc(n);
    if (q && p) memcpy(q, p, n); /* may read past the old block: it stays inside arena */
    return q;
}
void *aligned_alloc(size_t al, size_t n) { (void)al; return malloc(n); }
int posix_memalign(void **out, size_t al, size_t n) { (void)al; *out = malloc(n); return *out ? 0 : 12; }
void *memalign(size_t al, size_t n) { (void)al; return malloc(n); }
size_t malloc_usable_size(void *p) { (void)p; return 0; }
/* musl's own code (dlerror...) allocates through these names: without them, its malloc is linked in after all. */
void *__libc_malloc(size_t n) { return malloc(n); }
void *__libc_calloc(size_t a, size_t b) { return calloc(a, b); }
void *__libc_realloc(void *p, size_t n) { return realloc(p, n); }
void __libc_free(void *p) { free(p); }
#endif

int main(int argc, char **argv) {
    void *volatile p = malloc(64); /* volatile: the compiler may not drop a malloc/free pair */
    const char *pre = getenv("LD_PRELOAD");
    printf("ready preload=%s mallard=%d\n", pre ? pre : "", dlsym(RTLD_DEFAULT, "mallard_ctl") != NULL);
    fflush(stdout);
    if (argc > 1) sleep((unsigned)atoi(argv[1]));
    free(p);
    return 0;
}
