/* Test program: statically linked, allocates, prints "ready" and waits, so that `mallard which` can inspect it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    int hold = argc > 1 ? atoi(argv[1]) : 30; /* seconds to stay alive */
    char *p = malloc(100);
    if (!p)
        return 1;
    strcpy(p, "ready");
    puts(p);
    fflush(stdout);
    sleep((unsigned)hold);
    free(p);
    return 0;
}
