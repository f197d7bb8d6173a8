/* test_huge_double_free.c — a second free of a huge block that went to the huge cache is reported and ignored;
 * it used to link the cached mapping into the cache twice, and the next huge malloc looped forever (item 5). */
#include "mtest.h"
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>

static void child(void) {
  alarm(20);   /* a hang ends the child with SIGALRM: the parent reports it */
  for (int round = 0; round < 3; round++) {
    size_t n = (size_t)(6 + round) << 20;
    void *p = M_malloc(n);
    REQUIRE(p, "malloc");
    M_free(p);
    M_free(mt_hide(p));   /* the misuse: the mapping now sits in the huge cache */
    void *a = M_malloc(n), *b = M_malloc(n), *c = M_malloc(3u << 20);
    REQUIRE(a && b && c, "huge mallocs after the double free");
    CHECK(a != b, "two live blocks at the same address %p", a);
    mt_fill(a, n, 1);
    mt_fill(b, n, 2);
    CHECK(mt_verify(a, n, 1) == n && mt_verify(b, n, 2) == n, "blocks overlap");
    M_free(a);
    M_free(b);
    M_free(c);
  }
  MT_COLLECT(true);   /* walks and empties the cache: a cycle would loop here too */
  exit(mt_result("test_huge_double_free[" MT_MODE "] child"));
}

int main(void) {
  char path[] = "/tmp/mallard-hdf-XXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0, "mkstemp");
  unlink(path);
  pid_t pid = fork();
  REQUIRE(pid >= 0, "fork");
  if (pid == 0) {
    dup2(fd, 2);
    child();
  }
  int st;
  waitpid(pid, &st, 0);
  char buf[4096] = { 0 };
  ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  if (n > 0) fputs(buf, stdout);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child: %s %d (SIGALRM = hung)",
        WIFSIGNALED(st) ? "signal" : "exit status", WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
  CHECK(n > 0 && strstr(buf, "free("), "the double free was not reported on stderr");
  return mt_result("test_huge_double_free[" MT_MODE "]");
}
