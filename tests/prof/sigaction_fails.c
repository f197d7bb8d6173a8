/* sigaction_fails.c — a library preloaded before libmallard by test_prof_dumps.py: sigaction() of the signal numbered
 * in MLD_TEST_REFUSE_SIGNAL fails with EINVAL (as a sandbox or a reserved number would make it fail); every other call
 * goes to the C library. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdlib.h>

extern int __sigaction(int sig, const struct sigaction *sa, struct sigaction *old);   /* glibc's own entry */

int sigaction(int sig, const struct sigaction *sa, struct sigaction *old) {
  const char *refuse = getenv("MLD_TEST_REFUSE_SIGNAL");
  if (sa && refuse && atoi(refuse) == sig) {
    errno = EINVAL;
    return -1;
  }
  return __sigaction(sig, sa, old);
}
