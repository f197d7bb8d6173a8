/* Shared library of the `mallard heap` tests: one allocation site that lives in a .so, not in the program. */
#include <stdlib.h>
#include <string.h>

__attribute__((noinline)) void *heap_lib_alloc(size_t n) {
    char *p = malloc(n);  /* MARK heap_lib_alloc */
    if (p) memset(p, 3, n);
    return p;
}
