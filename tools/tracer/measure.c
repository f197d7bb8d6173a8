/* mallard-measure: runs a command as its child and reports the child tree's CPU time and peak RSS on a file descriptor. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

/*
 * Why a helper: a process's peak RSS (ru_maxrss) keeps the high-water mark of the image it replaced by exec, so a
 * command started directly by the Python CLI would report at least the interpreter's RSS. Forked from this small
 * program, the command's peak RSS is its own.
 *
 * Usage: mallard-measure FD CMD [ARGS...]
 *   The command gets LD_PRELOAD from MALLARD_MEASURE_LD_PRELOAD (so that the helper itself runs without it).
 *   On FD it writes "user_s sys_s max_rss_kib status" where status is the wait status; it exits like the command.
 *   Exit 127/126 (with a message) when the command cannot be executed.
 */
static pid_t child;

static void forward(int sig)
{
    if (child > 0)
        kill(child, sig);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: mallard-measure FD CMD [ARGS...]\n");
        return 2;
    }
    int fd = atoi(argv[1]);
    const char *preload = getenv("MALLARD_MEASURE_LD_PRELOAD");
    int errpipe[2];
    if (pipe2(errpipe, O_CLOEXEC) != 0)
        return 125;
    child = fork();
    if (child < 0) {
        perror("mallard-measure: fork");
        return 125;
    }
    if (child == 0) {
        close(errpipe[0]);
        if (fd > 2)
            close(fd);
        if (preload && *preload)
            setenv("LD_PRELOAD", preload, 1);
        unsetenv("MALLARD_MEASURE_LD_PRELOAD");
        execvp(argv[2], argv + 2);
        int e = errno; /* tell the parent why exec failed, through the close-on-exec pipe */
        if (write(errpipe[1], &e, sizeof e) < 0)
            _exit(127);
        _exit(e == ENOENT ? 127 : 126);
    }
    close(errpipe[1]);
    signal(SIGTERM, forward);
    signal(SIGINT, forward);
    signal(SIGHUP, forward);
    int exec_errno = 0;
    if (read(errpipe[0], &exec_errno, sizeof exec_errno) != (ssize_t)sizeof exec_errno)
        exec_errno = 0;
    close(errpipe[0]);
    int status = 0;
    struct rusage ru;
    while (wait4(child, &status, 0, &ru) < 0) {
        if (errno != EINTR) {
            perror("mallard-measure: wait4");
            return 125;
        }
    }
    if (exec_errno) {
        fprintf(stderr, "mallard-measure: cannot execute %s: %s\n", argv[2], strerror(exec_errno));
        dprintf(fd, "exec-failed %d\n", exec_errno);
        return exec_errno == ENOENT ? 127 : 126;
    }
    dprintf(fd, "%ld.%06ld %ld.%06ld %ld %d\n", (long)ru.ru_utime.tv_sec, (long)ru.ru_utime.tv_usec,
            (long)ru.ru_stime.tv_sec, (long)ru.ru_stime.tv_usec, ru.ru_maxrss, status);
    if (WIFSIGNALED(status)) {
        signal(WTERMSIG(status), SIG_DFL); /* die the same way, so the caller sees the signal */
        raise(WTERMSIG(status));
        return 128 + WTERMSIG(status);
    }
    return WEXITSTATUS(status);
}
