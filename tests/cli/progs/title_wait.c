/* title_wait.c: writes over its own argv/environment area, the way setproctitle() does in Redis, nginx or
 * PostgreSQL (so /proc/self/environ reads back zeros and LD_PRELOAD looks absent); allocates, says "ready", waits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern char **environ;

int main(int argc, char **argv)
{
    int secs = argc > 1 ? atoi(argv[1]) : 30;
    char *start = argv[0], *end = argv[argc - 1] + strlen(argv[argc - 1]);
    for (char **e = environ; *e; e++)
        if (*e + strlen(*e) > end)
            end = *e + strlen(*e);
    memset(start, 0, (size_t)(end - start));
    strcpy(start, "title_wait: serving");
    char *volatile p = malloc(1 << 20);
    memset(p, 1, 1 << 20);
    free(malloc(64)); /* binds free's slot too */
    printf("ready\n");
    fflush(stdout);
    sleep((unsigned)secs);
    free(p);
    return 0;
}
