/* mallard-bench-exec: runs a command with LD_PRELOAD set only for it and writes its own peak RSS, CPU and wall time as JSON. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/*
 * Why this exists: a process's peak RSS (ru_maxrss) keeps the high-water mark of the memory it had before exec,
 * so a command started straight from a large parent (a Python runner) inherits the parent's RSS as a floor.
 * This small program is the parent instead; it runs without the allocator under test, so the floor is its own
 * few hundred KiB.
 */
int main(int argc, char **argv) {
  if (argc < 5 || strcmp(argv[3], "--") != 0) {
    fprintf(stderr, "usage: %s OUT.json PRELOAD|'' -- COMMAND [ARGS...]\n", argv[0]);
    return 125;
  }
  const char *out = argv[1], *preload = argv[2];
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  pid_t pid = fork();
  if (pid < 0) {
    perror("mallard-bench-exec: fork");
    return 125;
  }
  if (pid == 0) {
    if (preload[0] && setenv("LD_PRELOAD", preload, 1) != 0) _exit(125);
    execvp(argv[4], argv + 4);
    fprintf(stderr, "mallard-bench-exec: cannot run %s: %s\n", argv[4], strerror(errno));
    _exit(127);
  }
  int status;
  struct rusage ru;
  while (wait4(pid, &status, 0, &ru) < 0) {
    if (errno != EINTR) {
      perror("mallard-bench-exec: wait4");
      return 125;
    }
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  FILE *f = fopen(out, "w");
  if (f) {
    fprintf(f, "{\"max_rss_kib\": %ld, \"user_s\": %.6f, \"sys_s\": %.6f, \"wall_s\": %.6f, \"status\": %d}\n",
            ru.ru_maxrss, (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6,
            (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6,
            (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9, status);
    fclose(f);
  }
  if (WIFSIGNALED(status)) {
    /* Die the same way, so the caller sees the signal and not an exit code. */
    int sig = WTERMSIG(status);
    signal(sig, SIG_DFL);
    struct rlimit nocore = {0, 0};
    setrlimit(RLIMIT_CORE, &nocore);
    raise(sig);
    return 128 + sig;
  }
  return WEXITSTATUS(status);
}
