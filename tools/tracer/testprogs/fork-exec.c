/* Test program: 100 malloc(1111) in the parent, a forked child with 200 malloc(2222), then exec of itself making 300 malloc(3333). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void allocate(int n, size_t size)
{
    for (int i = 0; i < n; i++) {
        void *p = malloc(size);
        if (!p)
            abort();
        free(p);
    }
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "after-exec") == 0) {
        allocate(300, 3333);
        puts("after exec: 300 malloc(3333)");
        return 0;
    }
    allocate(100, 1111);
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        return 1;
    if (pid == 0) {
        allocate(200, 2222);
        exit(0);
    }
    int status;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return 1;
    execl("/proc/self/exe", argv[0], "after-exec", (char *)NULL);
    perror("execl");
    return 1;
}
