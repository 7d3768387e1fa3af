/* SPDX-License-Identifier: MIT
 * bench_rusage: run a command and report its peak RSS and CPU time, as `/usr/bin/time -f`
 * would, without needing that package.
 *
 * usage: bench_rusage OUT_FILE COMMAND [ARG...]
 * Runs COMMAND, passes SIGTERM and SIGINT on to it, and when it has exited writes one
 * line `maxrss_kb=N user_s=S sys_s=S` to OUT_FILE (from wait4(): the child's ru_maxrss,
 * kB on Linux, and its ru_utime / ru_stime). Exits with COMMAND's exit status, 128 + N
 * when signal N ended it, 126/127 when it could not be run, 2 on usage errors. COMMAND
 * gets SIGKILL if bench_rusage dies first, so killing this process never leaves it
 * behind.
 *
 * Why a program of its own: a Linux process's ru_maxrss starts from the RSS of the
 * process that exec'd it. Python's subprocess (vfork + exec) hands its whole
 * interpreter's RSS, 14 MB and more, to every child, more than lapse itself uses; this
 * program is ~1 MB. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t child = 0;

static void forward(int sig) {
    if (child > 0) {
        kill(child, sig);
    }
}

static double seconds(struct timeval tv) {
    return (double)tv.tv_sec + (double)tv.tv_usec / 1e6;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fputs("usage: bench_rusage OUT_FILE COMMAND [ARG...]\n", stderr);
        return 2;
    }
    const char *out_path = argv[1];
    pid_t parent = getpid();
    struct sigaction sa = {.sa_handler = forward};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    /* Held back until the child's pid is known, so that none is lost. */
    sigset_t stop_signals, old_mask;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGINT);
    sigprocmask(SIG_BLOCK, &stop_signals, &old_mask);

    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "bench_rusage: fork: %s\n", strerror(errno));
        return 126;
    }
    if (pid == 0) {
        signal(SIGTERM, SIG_DFL);
        signal(SIGINT, SIG_DFL);
        sigprocmask(SIG_SETMASK, &old_mask, NULL);
        /* If the parent is already gone, the death signal would never come. */
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) {
            _exit(126);
        }
        execvp(argv[2], argv + 2);
        fprintf(stderr, "bench_rusage: %s: %s\n", argv[2], strerror(errno));
        _exit(errno == ENOENT ? 127 : 126);
    }
    child = pid;
    sigprocmask(SIG_SETMASK, &old_mask, NULL);

    int status = 0;
    struct rusage ru;
    while (wait4(pid, &status, 0, &ru) < 0) {
        if (errno != EINTR) {
            fprintf(stderr, "bench_rusage: wait4: %s\n", strerror(errno));
            return 126;
        }
    }
    child = 0;

    FILE *out = fopen(out_path, "w");
    if (!out) {
        fprintf(stderr, "bench_rusage: %s: %s\n", out_path, strerror(errno));
        return 126;
    }
    fprintf(out, "maxrss_kb=%ld user_s=%.3f sys_s=%.3f\n", ru.ru_maxrss,
            seconds(ru.ru_utime), seconds(ru.ru_stime));
    if (fclose(out) != 0) {
        fprintf(stderr, "bench_rusage: %s: %s\n", out_path, strerror(errno));
        return 126;
    }
    if (WIFSIGNALED(status)) {
        return 128 + WTERMSIG(status);
    }
    return WEXITSTATUS(status);
}
