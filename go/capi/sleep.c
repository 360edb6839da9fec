// zct_sleep: a sleep on a futex word outside the Go runtime.
//
// Note [sleeping outside Go] in package futex says why: a host thread that
// sleeps in a system call made by Go code costs the runtime's monitor
// thread some sixty wake-ups per sleep; one that sleeps here costs one.
//
// Threat model: any code in the process may call this with any address
// and value. It reads and writes no memory itself: the kernel compares the
// word (EFAULT for an address that is not mapped, as after the handle that
// gave it was closed), so a forged or stale address can make it fail or
// sleep until its timeout, never fault. It holds no lock and changes no
// count: the sleeper was counted by zct_queue_arm or zct_stream_reader_arm.
#define _GNU_SOURCE
#include <errno.h>
#include <linux/futex.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include "zctipc.h"
#include "internal.h"

// recheck bounds one futex call of a sleep for ever, so that a word that
// moved without a wake-up (one lost with a killed process) is seen.
#define RECHECK_MS 1000

static int fail(int status, const char *what, int errnum) {
    char msg[128];
    int n = snprintf(msg, sizeof msg, "zct_sleep: %s", what);
    zct_set_last_error(msg, n > 0 ? (size_t)n : 0, errnum);
    return status;
}

int zct_sleep(const uint32_t *word, uint32_t seen, int64_t timeout_ms) {
    if (word == NULL) {
        return fail(ZCT_E_INVALID, "a NULL word", EINVAL);
    }
    struct timespec now, end = {0, 0};
    if (timeout_ms >= 0) {
        clock_gettime(CLOCK_MONOTONIC, &end);
        end.tv_sec += timeout_ms / 1000;
        end.tv_nsec += (timeout_ms % 1000) * 1000000;
        if (end.tv_nsec >= 1000000000) {
            end.tv_sec++;
            end.tv_nsec -= 1000000000;
        }
    }
    for (;;) {
        int64_t ns = (int64_t)RECHECK_MS * 1000000;
        if (timeout_ms >= 0) {
            clock_gettime(CLOCK_MONOTONIC, &now);
            int64_t secs = (int64_t)(end.tv_sec - now.tv_sec); // a timeout of years would overflow in ns
            int64_t left = secs > 2 ? ns : secs * 1000000000 + (end.tv_nsec - now.tv_nsec);
            if (left <= 0) {
                return ZCT_E_EMPTY;
            }
            if (left < ns) {
                ns = left;
            }
        }
        struct timespec ts = {ns / 1000000000, ns % 1000000000};
        // Relative timeout; the word is compared by the kernel.
        long r = syscall(SYS_futex, word, FUTEX_WAIT, seen, &ts, NULL, 0);
        if (r == 0) {
            return ZCT_OK; // woken (or spuriously: the caller looks again)
        }
        switch (errno) {
        case EAGAIN:
            return ZCT_OK; // the word no longer holds seen
        case ETIMEDOUT:
            continue; // the deadline, or a recheck: the loop says which
        case EINTR:
            return fail(ZCT_E_INTERRUPTED, "interrupted by a signal", EINTR);
        case EFAULT:
            return fail(ZCT_E_CLOSED, "the word is not mapped (its handle was closed)", EFAULT);
        default:
            return fail(ZCT_E_OS, strerror(errno), errno);
        }
    }
}
