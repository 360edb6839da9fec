// The waits of zct_queue_take in C (fast.c: a spin, then a sleep among the
// data word's sleepers, for a handle of the default policy): a timeout too
// long to add to the clock waits for ever, as Go's waits do; a timeout is
// waited out; takes asleep in many threads are each woken by a put and
// none is left asleep with a message there; a close wakes them (ZCT_E_CLOSED),
// a signal interrupts them (ZCT_E_INTERRUPTED), a file shrunk under them
// ends them (ZCT_E_CORRUPT); and every sleeper's count goes back, so that
// the waiter counts in shared memory are those of the sleepers left. It
// prints "ok" when every check passes.
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include "mapped.h"

static zct_handle queue;

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void *put_later(void *arg) {
    usleep((useconds_t)(intptr_t)arg * 1000);
    CHECK(zct_queue_put(queue, ZCT_RECORD_BYTES, "late", 4, NULL, 0, 0) == ZCT_OK);
    return NULL;
}

/* Timeouts too long to add to the clock, at and past where the sum
   overflows: the take waits (for a put 100 ms on). */
static void long_timeouts(void) {
    CHECK(zct_queue_create(NULL, 4096, 0, &queue) == ZCT_OK);
    int64_t timeouts[] = {INT64_MAX, INT64_MAX / 1000000 + 1, INT64_MAX / 1000000 - 1, INT64_MAX / 2, -1, -7};
    for (int i = 0; i < 6; i++) {
        pthread_t t;
        CHECK(pthread_create(&t, NULL, put_later, (void *)(intptr_t)100) == 0);
        uint8_t buf[64];
        CHECK(take_plain(queue, buf, sizeof buf, timeouts[i]) == 4);
        CHECK(pthread_join(t, NULL) == 0);
    }
    /* And a short one is waited out, not cut short. */
    int64_t start = now_ms();
    uint8_t buf[64];
    CHECK(take_plain(queue, buf, sizeof buf, 150) == ZCT_E_EMPTY);
    CHECK(now_ms() - start >= 140);
    CHECK(zct_queue_close(queue) == ZCT_OK);
}

/* Consumers asleep in C, woken one per put: every message is taken and
   none of them sleeps on with one there. */
static volatile int taken_count;

static void *consume(void *arg) {
    int n = (int)(intptr_t)arg;
    uint8_t buf[64];
    for (int i = 0; i < n; i++) {
        CHECK(take_plain(queue, buf, sizeof buf, 10000) == 4);
        __atomic_add_fetch(&taken_count, 1, __ATOMIC_SEQ_CST);
    }
    return NULL;
}

static void wake_ups(void) {
    CHECK(zct_queue_create(NULL, 4096, 0, &queue) == ZCT_OK);
    mapped m = map_queue(queue);
    enum { THREADS = 6, EACH = 300 };
    pthread_t t[THREADS];
    taken_count = 0;
    for (long i = 0; i < THREADS; i++) {
        CHECK(pthread_create(&t[i], NULL, consume, (void *)(intptr_t)EACH) == 0);
    }
    unsigned seed = 7;
    for (int i = 0; i < THREADS * EACH; i++) {
        if (rand_r(&seed) % 4 == 0) {
            usleep(rand_r(&seed) % 300);
        }
        int r;
        while ((r = zct_queue_put(queue, ZCT_RECORD_BYTES, "msg!", 4, NULL, 0, 0)) == ZCT_E_FULL) {
        }
        CHECK(r == ZCT_OK);
    }
    for (int i = 0; i < THREADS; i++) {
        CHECK(pthread_join(t[i], NULL) == 0);
    }
    CHECK(taken_count == THREADS * EACH);
    CHECK(ld32(&m, DATA_WAITERS) == 0);
    unmap_queue(&m);
    CHECK(zct_queue_close(queue) == ZCT_OK);
}

/* Takes asleep when their handle closes, when a signal comes, when the
   file is cut. */
static void *sleeper(void *arg) {
    uint8_t buf[64];
    *(int64_t *)arg = take_plain(queue, buf, sizeof buf, -1);
    return NULL;
}

static void on_signal(int sig) { (void)sig; }

static void wait_for_sleepers(const mapped *m, uint32_t n) {
    while (ld32(m, DATA_WAITERS) < n) {
        usleep(1000);
    }
}

static void ended(const char *name) {
    zct_handle other;
    CHECK(zct_queue_create(name, 4096, 0, &other) == ZCT_OK);
    mapped m = map_queue(other);
    uint32_t *word, seen;
    CHECK(zct_queue_arm(other, ZCT_WAIT_DATA, &word, &seen) == ZCT_OK); /* a sleeper of its own */

    /* A close wakes every take asleep on the handle. */
    for (int round = 0; round < 20; round++) {
        CHECK(zct_queue_attach(name, 0, &queue) == ZCT_OK);
        pthread_t t[4];
        int64_t r[4];
        for (int i = 0; i < 4; i++) {
            CHECK(pthread_create(&t[i], NULL, sleeper, &r[i]) == 0);
        }
        wait_for_sleepers(&m, 5);
        CHECK(zct_queue_close(queue) == ZCT_OK);
        for (int i = 0; i < 4; i++) {
            CHECK(pthread_join(t[i], NULL) == 0);
            CHECK(r[i] == ZCT_E_CLOSED);
        }
        CHECK(ld32(&m, DATA_WAITERS) == 1);
    }

    /* A signal whose handler does not restart calls interrupts a take. */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    CHECK(sigaction(SIGUSR1, &sa, NULL) == 0);
    CHECK(zct_queue_attach(name, 0, &queue) == ZCT_OK);
    pthread_t t;
    int64_t r;
    CHECK(pthread_create(&t, NULL, sleeper, &r) == 0);
    wait_for_sleepers(&m, 2);
    CHECK(pthread_kill(t, SIGUSR1) == 0);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK(r == ZCT_E_INTERRUPTED);
    CHECK(ld32(&m, DATA_WAITERS) == 1);

    /* A file cut under a take asleep ends it. */
    CHECK(pthread_create(&t, NULL, sleeper, &r) == 0);
    wait_for_sleepers(&m, 2);
    CHECK(ftruncate(m.fd, 0) == 0); /* the hostile process */
    CHECK(pthread_join(t, NULL) == 0);
    CHECK(r == ZCT_E_CORRUPT);
    CHECK(unlink(m.path) == 0);
    unmap_queue(&m);
    (void)zct_queue_close(queue);
    (void)zct_queue_close(other);
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    long_timeouts();
    wake_ups();
    char name[256];
    snprintf(name, sizeof name, "%s-ended", argv[1]);
    ended(name);
    printf("ok\n");
    return 0;
}
