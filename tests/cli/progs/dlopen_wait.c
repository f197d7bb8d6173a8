/* dlopen_wait.c: opens an allocator library with dlopen (it maps it but cannot interpose malloc), says "ready", waits. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc < 2 || !dlopen(argv[1], RTLD_NOW | RTLD_LOCAL)) {
        fprintf(stderr, "dlopen failed: %s\n", argc < 2 ? "no path" : dlerror());
        return 1;
    }
    char *volatile p = malloc(100);
    p[0] = 1;
    printf("ready\n");
    fflush(stdout);
    sleep(30);
    free(p);
    return 0;
}
