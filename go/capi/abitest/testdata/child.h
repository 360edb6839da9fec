// run_child, shared by the C programs of the ABI tests that run a part of
// themselves in a child process: the program again, by exec, with mode as
// its one argument, which must die of want_signal (0: exit with status 0).
#ifndef ABITEST_CHILD_H
#define ABITEST_CHILD_H

#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

static void run_child(const char *self, const char *mode, int want_signal) {
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        execl(self, self, mode, (char *)NULL);
        _exit(127);
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid);
    int ok = want_signal ? WIFSIGNALED(status) && WTERMSIG(status) == want_signal
                         : WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok) {
        fprintf(stderr, "child %s: status %#x\n", mode, status);
    }
    CHECK(ok);
}

#endif
