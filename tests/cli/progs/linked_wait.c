/* linked_wait.c: a program linked against an allocator library (by the test's link line); allocates, says "ready", waits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    int secs = argc > 1 ? atoi(argv[1]) : 30;
    char *volatile p = malloc(1 << 20);
    memset(p, 1, 1 << 20);
    printf("ready\n");
    fflush(stdout);
    sleep((unsigned)secs);
    free(p);
    return 0;
}
