/* Test program: one call of each malloc-family variant with a distinctive size, so the profiler's per-function counts can be checked. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>

#ifndef __GLIBC__
/* musl has no pvalloc: the one the tracer (or a preloaded Mallard) exports, else glibc's meaning through memalign. */
static void *pvalloc(size_t size)
{
    void *(*f)(size_t) = (void *(*)(size_t))dlsym(RTLD_DEFAULT, "pvalloc");
    return f ? f(size) : memalign(4096, (size + 4095) & ~(size_t)4095);
}
#endif

int main(void)
{
    void *p[7];
    p[0] = calloc(3, 1000);               /* size 3000 */
    p[1] = aligned_alloc(64, 640);        /* size 640 */
    if (posix_memalign(&p[2], 128, 1280)) /* size 1280 */
        return 1;
    p[3] = memalign(256, 2560);           /* size 2560 */
    p[4] = valloc(5000);
    p[5] = pvalloc(6000);
    p[6] = reallocarray(NULL, 7, 1000);   /* size 7000 */
    for (int i = 0; i < 7; i++) {
        if (!p[i])
            return 1;
        free(p[i]);
    }
    puts("variants: calloc aligned_alloc posix_memalign memalign valloc pvalloc reallocarray");
    return 0;
}
