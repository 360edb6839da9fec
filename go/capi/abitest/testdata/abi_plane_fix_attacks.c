// Attacks on three fixes of the stream data plane in fast.c and stream.c:
// the busy word's WANTED mark (Note [a call of Go's waits for the busy
// word]), a next whose look goes to Go (Note [the rest of a next in Go]),
// and the time left that a wait hands to Go, rounded up to the
// millisecond. Attacked: Go's calls (stats, set_wait, a writer's position by its
// stats) from many threads against C steps on one reader and one writer,
// the C steps going on once Go's calls are done; a close while
// Go's calls wait for a look in C; many threads calling next on one reader
// while others switch its policy and read its counts, each frame returned
// once, whole, through the end; timeouts of 0, 1 to 3 ms, negative and
// past the clock's range on every policy, a look or a next never empty
// before its deadline. A hang is caught by a watchdog (SIGALRM). It prints
// "ok" when every check passes.
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "clock.h"

#define SEQ __ATOMIC_SEQ_CST

/* -- a stream ------------------------------------------------------------ */

typedef struct {
    zct_handle s, w, r;
    zct_stream_info info;
} stream;

static stream make_stream(int32_t frames, int32_t policy, int64_t reader_timeout_ms) {
    stream st;
    int64_t shape[1] = {4};
    CHECK(zct_stream_create(NULL, ZCT_FLOAT32, 1, shape, frames, 1, policy, reader_timeout_ms, &st.s, &st.info) ==
          ZCT_OK);
    int32_t index;
    CHECK(zct_stream_reader(st.s, -1, &st.r, &index) == ZCT_OK);
    CHECK(zct_stream_writer(st.s, &st.w) == ZCT_OK);
    return st;
}

static void close_stream(stream *st) {
    CHECK(zct_stream_writer_close(st->w) == ZCT_OK);
    CHECK(zct_stream_reader_close(st->r) == ZCT_OK);
    CHECK(zct_stream_close(st->s) == ZCT_OK);
}

static float *frame(const stream *st, int32_t slot) {
    return (float *)((uint8_t *)st->info.data + st->info.ring_offset + (uint64_t)slot * st->info.stride);
}

static void publish(const stream *st, float value) {
    int32_t slot = -1;
    CHECK(zct_stream_write_look(st->w, 30000, &slot) == ZCT_OK);
    frame(st, slot)[0] = value;
    CHECK(zct_stream_write_increment(st->w) == ZCT_OK);
}

static void position(const stream *st, uint64_t *pos, uint64_t *received, uint64_t *dropped) {
    CHECK(zct_stream_reader_stats(st->r, pos, received, dropped) == ZCT_OK);
}

/* Frames claimed, published and read one by one, each whole and in order
   (under the default policy each step runs in C). */
static void steps_in_c(const stream *st, int frames, float from) {
    for (int i = 0; i < frames; i++) {
        publish(st, from + (float)i);
        int32_t slot = -1, whole = 0;
        CHECK(zct_stream_read_next(st->r, 1000, &slot, &whole) == ZCT_OK && whole == 1);
        CHECK(frame(st, slot)[0] == from + (float)i);
    }
}

/* -- the WANTED mark ------------------------------------------------------ */

static stream mixed;
static volatile int mixing;
static long go_calls_done;

/* Looks in C, 20 ms each, waiting most of the time: the word is free for
   nanoseconds between two. */
static void *look_again_and_again(void *arg) {
    (void)arg;
    while (__atomic_load_n(&mixing, SEQ)) {
        int32_t slot = -1;
        int k = zct_stream_read_look(mixed.r, 20, &slot);
        CHECK(k == ZCT_OK || k == ZCT_E_EMPTY);
        if (k == ZCT_OK) {
            int32_t whole = 0;
            k = zct_stream_read_increment(mixed.r, &whole);
            CHECK(k == ZCT_OK || k == ZCT_E_INVALID);
        }
    }
    return NULL;
}

/* Go's calls on the reader: counts, and policies that wait in C. */
static void *go_calls(void *arg) {
    int n = (int)(intptr_t)arg;
    for (int i = 0; i < n; i++) {
        uint64_t pos, received, dropped;
        position(&mixed, &pos, &received, &dropped);
        CHECK(zct_stream_reader_set_wait(mixed.r, i % 2, -1) == ZCT_OK);
        __atomic_add_fetch(&go_calls_done, 1, SEQ);
    }
    return NULL;
}

/* Arms and disarms through the C ABI among them. */
static void *arms(void *arg) {
    (void)arg;
    while (__atomic_load_n(&mixing, SEQ)) {
        uint32_t *word, seen;
        CHECK(zct_stream_reader_arm(mixed.r, &word, &seen) == ZCT_OK);
        CHECK(zct_stream_reader_disarm(mixed.r) == ZCT_OK);
    }
    return NULL;
}

static void *writes(void *arg) {
    (void)arg;
    for (float v = 0; __atomic_load_n(&mixing, SEQ); v++) {
        int32_t slot = -1;
        int k = zct_stream_write_look(mixed.w, 5, &slot);
        CHECK(k == ZCT_OK || k == ZCT_E_FULL);
        if (k == ZCT_OK) {
            CHECK(zct_stream_write_increment(mixed.w) == ZCT_OK);
        }
        sleep_ms(1);
    }
    return NULL;
}

static void wanted_mark(void) {
    mixed = make_stream(8, 0, 0);
    steps_in_c(&mixed, 20, 0);
    enum { LOOKERS = 3, CALLERS = 3, CALLS = 60 };
    __atomic_store_n(&mixing, 1, SEQ);
    go_calls_done = 0;
    pthread_t look[LOOKERS], call[CALLERS], arm, wr;
    for (int i = 0; i < LOOKERS; i++) {
        CHECK(pthread_create(&look[i], NULL, look_again_and_again, NULL) == 0);
    }
    CHECK(pthread_create(&arm, NULL, arms, NULL) == 0);
    CHECK(pthread_create(&wr, NULL, writes, NULL) == 0);
    for (int i = 0; i < CALLERS; i++) {
        CHECK(pthread_create(&call[i], NULL, go_calls, (void *)(intptr_t)CALLS) == 0);
    }
    for (int i = 0; i < CALLERS; i++) {
        CHECK(pthread_join(call[i], NULL) == 0); /* not starved: the watchdog says otherwise */
    }
    CHECK(go_calls_done == CALLERS * CALLS);
    __atomic_store_n(&mixing, 0, SEQ);
    for (int i = 0; i < LOOKERS; i++) {
        CHECK(pthread_join(look[i], NULL) == 0);
    }
    CHECK(pthread_join(arm, NULL) == 0);
    CHECK(pthread_join(wr, NULL) == 0);
    CHECK(zct_stream_reader_set_wait(mixed.r, 0, -1) == ZCT_OK);
    /* Go's calls are done: no mark is left, and every step runs in C
       again. */
    int32_t slot = -1, whole = 0;
    while (zct_stream_read_next(mixed.r, 0, &slot, &whole) == ZCT_OK) {
    }
    steps_in_c(&mixed, 50, 1000);
    close_stream(&mixed);
}

/* A close while Go's calls wait for a look that waits in C for ever: the
   look ends closed, and so do the calls; nothing waits on. */
static void *look_for_ever(void *arg) {
    (void)arg;
    int32_t slot = -1;
    int k = zct_stream_read_look(mixed.r, -1, &slot);
    CHECK(k == ZCT_E_CLOSED);
    return NULL;
}

static void *stats_once(void *arg) {
    (void)arg;
    uint64_t pos, received, dropped;
    int k = zct_stream_reader_stats(mixed.r, &pos, &received, &dropped);
    CHECK(k == ZCT_OK || k == ZCT_E_CLOSED);
    __atomic_add_fetch(&go_calls_done, 1, SEQ);
    return NULL;
}

static void close_while_wanted(void) {
    mixed = make_stream(4, 0, 0);
    pthread_t look, stats[4];
    CHECK(pthread_create(&look, NULL, look_for_ever, NULL) == 0);
    sleep_ms(50);
    go_calls_done = 0;
    for (int i = 0; i < 4; i++) {
        CHECK(pthread_create(&stats[i], NULL, stats_once, NULL) == 0);
    }
    sleep_ms(50);
    CHECK(zct_stream_reader_close(mixed.r) == ZCT_OK);
    CHECK(pthread_join(look, NULL) == 0);
    for (int i = 0; i < 4; i++) {
        CHECK(pthread_join(stats[i], NULL) == 0);
    }
    CHECK(zct_stream_writer_close(mixed.w) == ZCT_OK);
    CHECK(zct_stream_close(mixed.s) == ZCT_OK);
}

/* -- many nexts on one reader -------------------------------------------- */

/* sleep (C), poll for ever (C), spin then sleep (Go), poll a while then
   sleep (Go). */
static const struct {
    int32_t poll;
    int64_t spin_ns;
} policies[] = {{0, -1}, {1, -1}, {0, 20000}, {1, 100000}, {1, 0}};
enum { NPOLICIES = sizeof policies / sizeof policies[0] };

enum { NEXTERS = 8, FRAMES = 3000 };
static stream many;
static int returned[FRAMES];
static long nexts_ok, not_whole;

static void *next_until_end(void *arg) {
    int64_t timeout = (int64_t)(intptr_t)arg;
    for (;;) {
        int32_t slot = -1, whole = 0;
        int k = zct_stream_read_next(many.r, timeout, &slot, &whole);
        if (whole != 1) {
            __atomic_add_fetch(&not_whole, 1, SEQ);
        }
        if (k == ZCT_E_ENDED) {
            return NULL;
        }
        if (k == ZCT_E_EMPTY) {
            continue;
        }
        CHECK(k == ZCT_OK);
        /* Under Block the frame stays until a next releases it: the slot
           was stored by the writer before the publish, the value too. */
        uint64_t pos, received, dropped;
        (void)pos, (void)received, (void)dropped;
        __atomic_add_fetch(&nexts_ok, 1, SEQ);
    }
}

static volatile int switching;

static void *switch_policies(void *arg) {
    (void)arg;
    for (int i = 0; __atomic_load_n(&switching, SEQ); i++) {
        CHECK(zct_stream_reader_set_wait(many.r, policies[i % NPOLICIES].poll, policies[i % NPOLICIES].spin_ns) ==
              ZCT_OK);
        uint64_t pos, received, dropped;
        position(&many, &pos, &received, &dropped);
        CHECK(pos <= FRAMES && received <= pos);
        sleep_ms(1);
    }
    return NULL;
}

static void many_nexts(int64_t timeout) {
    many = make_stream(8, 0, 0);
    memset(returned, 0, sizeof returned);
    nexts_ok = 0;
    not_whole = 0;
    pthread_t t[NEXTERS], sw;
    __atomic_store_n(&switching, 1, SEQ);
    CHECK(pthread_create(&sw, NULL, switch_policies, NULL) == 0);
    for (int i = 0; i < NEXTERS; i++) {
        CHECK(pthread_create(&t[i], NULL, next_until_end, (void *)(intptr_t)(i % 2 ? timeout : -1)) == 0);
    }
    for (int i = 0; i < FRAMES; i++) {
        publish(&many, (float)i);
    }
    CHECK(zct_stream_end(many.s) == ZCT_OK);
    for (int i = 0; i < NEXTERS; i++) {
        CHECK(pthread_join(t[i], NULL) == 0);
    }
    __atomic_store_n(&switching, 0, SEQ);
    CHECK(pthread_join(sw, NULL) == 0);
    uint64_t pos, received, dropped;
    position(&many, &pos, &received, &dropped);
    if (nexts_ok != FRAMES || pos != FRAMES || received != FRAMES || dropped != 0 || not_whole != 0) {
        fprintf(stderr, "nexts %ld of %d frames, position %lu, received %lu, dropped %lu, not whole %ld\n", nexts_ok,
                FRAMES, (unsigned long)pos, (unsigned long)received, (unsigned long)dropped, not_whole);
    }
    CHECK(nexts_ok == FRAMES);
    CHECK(pos == FRAMES && received == FRAMES && dropped == 0);
    CHECK(not_whole == 0);
    close_stream(&many);
}

/* -- timeouts handed to Go ------------------------------------------------ */

static stream timed;

static void *publish_later(void *arg) {
    sleep_ms(30);
    publish(&timed, (float)(intptr_t)arg);
    return NULL;
}

/* A look, a next with a frame to release first, and a claim with the ring
   full, each of timeout ms and finding nothing: empty (full), never before
   the timeout. */
static void timed_out(int64_t ms) {
    int32_t slot = -1, whole = 0;
    int64_t start = now_ns();
    CHECK(zct_stream_read_look(timed.r, ms, &slot) == ZCT_E_EMPTY);
    CHECK(now_ns() - start >= ms * 1000000LL);

    uint64_t pos0, pos1, received, dropped;
    publish(&timed, 7);
    CHECK(zct_stream_read_look(timed.r, 0, &slot) == ZCT_OK);
    position(&timed, &pos0, &received, &dropped);
    start = now_ns();
    CHECK(zct_stream_read_next(timed.r, ms, &slot, &whole) == ZCT_E_EMPTY);
    CHECK(now_ns() - start >= ms * 1000000LL);
    CHECK(whole == 1);
    position(&timed, &pos1, &received, &dropped);
    CHECK(pos1 == pos0 + 1); /* the frame looked at was released, once */
}

static void timeouts(void) {
    timed = make_stream(2, 0, 0);
    int value = 100;
    for (int p = 0; p < NPOLICIES; p++) {
        CHECK(zct_stream_reader_set_wait(timed.r, policies[p].poll, policies[p].spin_ns) == ZCT_OK);
        CHECK(zct_stream_writer_set_wait(timed.w, policies[p].poll, policies[p].spin_ns) == ZCT_OK);
        for (int64_t ms = 0; ms <= 3; ms++) {
            for (int rep = 0; rep < 5; rep++) {
                timed_out(ms);
            }
        }
        /* A claim with the ring full waits out its timeout in Go. */
        publish(&timed, 1);
        publish(&timed, 2);
        for (int64_t ms = 0; ms <= 3; ms++) {
            int32_t slot = -1;
            int64_t start = now_ns();
            CHECK(zct_stream_write_look(timed.w, ms, &slot) == ZCT_E_FULL);
            CHECK(now_ns() - start >= ms * 1000000LL);
        }
        int32_t slot = -1, whole = 0;
        while (zct_stream_read_next(timed.r, 0, &slot, &whole) == ZCT_OK) {
        }
        /* Timeouts that wait for ever: a frame ends them. */
        const int64_t for_ever[] = {-1, INT64_MIN, INT64_MAX, INT64_MAX / 1000000 + 1, INT64_MAX / 1000000 - 1};
        for (size_t i = 0; i < sizeof for_ever / sizeof for_ever[0]; i++) {
            pthread_t t;
            CHECK(pthread_create(&t, NULL, publish_later, (void *)(intptr_t)++value) == 0);
            CHECK(zct_stream_read_next(timed.r, for_ever[i], &slot, &whole) == ZCT_OK && whole == 1);
            CHECK(frame(&timed, slot)[0] == (float)value);
            CHECK(pthread_join(t, NULL) == 0);
        }
        CHECK(zct_stream_read_increment(timed.r, &whole) == ZCT_OK && whole == 1);
    }
    /* An end goes to Go, which says so at once. */
    CHECK(zct_stream_end(timed.s) == ZCT_OK);
    int32_t slot = -1, whole = 0;
    CHECK(zct_stream_read_next(timed.r, 1, &slot, &whole) == ZCT_E_ENDED && whole == 1);
    close_stream(&timed);
}

int main(void) {
    alarm(300); /* a hang is a failure, not a stuck test */
    timeouts();
    wanted_mark();
    close_while_wanted();
    many_nexts(1);
    many_nexts(20);
    printf("ok\n");
    return 0;
}
