// The clock of the C programs of the ABI tests that wait: now_ns reads the
// monotonic clock, sleep_ms sleeps.
#ifndef ABITEST_CLOCK_H
#define ABITEST_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline void sleep_ms(int64_t ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

#endif
