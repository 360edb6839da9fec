// A model of the sleepers that arms count (Note [an arm is the handle's
// once counted] in fast.c): threads of one handle arm and disarm a queue's
// three wait words, and a stream reader's data word, at random (pass_on 0
// and 1, zct_sleep between, a reader's looks that arm and disarm inside),
// each keeping its own arms in balance, while a second handle holds arms
// of its own. At each stop the shared waiter counts (and a reader slot's
// armed count) equal the model's sum of the arms not taken back, a disarm
// of a thread that holds an arm is never refused, and a close of the handle
// while its threads go on leaves the other handle's arms alone. Then
// counts forged in the file (0, 1, 2^31, 2^32 - 1), on the word and in the
// reader's slot: a disarm never wraps them round, and a sleeper armed
// after the forgery is woken by a put or a publish, never left to its
// timeout. It takes a name (the queue's and the stream's) and prints "ok"
// when every check passes.
#define _GNU_SOURCE
#include <pthread.h>
#include "clock.h"
#include "mapped.h"

#define SEQ __ATOMIC_SEQ_CST
#define THREADS 4
#define STOPS 6
#define OPS 200
#define ROUNDS 12
#define STREAM_DATA_WAITERS 388
#define READERS_AT 576
#define READER_SIZE 64
#define READER_ARMED 56
#define WAKE_MS 10000 /* far above a wake-up: only a lost one reaches it */

static const int waiters_at[3] = {DATA_WAITERS, SPACE_WAITERS, JOIN_WAITERS};

/* -- the threads of one handle ------------------------------------------- */

typedef struct {
    int id;
    unsigned rng;
    int32_t local[3]; /* this thread's arms not yet taken back, per word */
    int closed;       /* it met the close */
} worker;

static zct_handle target;     /* the handle the threads use */
static int is_reader;         /* a stream reader's, else a queue's */
static int last_stop_closes;  /* the last stop is a close, not a barrier */
static pthread_barrier_t stop, go_on;
static worker workers[THREADS];

static int arm_one(int w, uint32_t **word, uint32_t *seen) {
    return is_reader ? zct_stream_reader_arm(target, word, seen) : zct_queue_arm(target, w, word, seen);
}

static int disarm_one(int w, int pass_on) {
    return is_reader ? zct_stream_reader_disarm(target) : zct_queue_disarm(target, w, pass_on);
}

/* One random step: an arm (and a short sleep on it), a disarm of an arm
   this thread holds (which must never be refused), or a look or take that
   waits briefly (arming and disarming inside). ZCT_E_CLOSED once the
   handle closed. */
static int step(worker *me) {
    int nw = is_reader ? 1 : 3;
    int w = (int)(rand_r(&me->rng) % (unsigned)nw);
    uint32_t *word, seen;
    int r;
    switch (rand_r(&me->rng) % 5) {
    case 0:
    case 1:
        r = arm_one(w, &word, &seen);
        CHECK(r == ZCT_OK || r == ZCT_E_CLOSED);
        if (r == ZCT_OK) {
            me->local[w]++;
            if (rand_r(&me->rng) % 4 == 0) {
                int s = zct_sleep(word, seen, rand_r(&me->rng) % 2);
                CHECK(s == ZCT_OK || s == ZCT_E_EMPTY || s == ZCT_E_INTERRUPTED || s == ZCT_E_CLOSED);
            }
        }
        return r;
    case 2:
    case 3:
        if (me->local[w] == 0) {
            return ZCT_OK;
        }
        r = disarm_one(w, (int)(rand_r(&me->rng) % 2));
        /* This thread's arm is counted by the handle: never refused. */
        CHECK(r == ZCT_OK || r == ZCT_E_CLOSED);
        if (r == ZCT_OK) {
            me->local[w]--;
        }
        return r;
    default:
        if (is_reader) {
            int32_t slot;
            r = zct_stream_read_look(target, rand_r(&me->rng) % 2, &slot);
            CHECK(r == ZCT_E_EMPTY || r == ZCT_E_CLOSED);
        } else {
            uint8_t buf[64];
            r = (int)take_plain(target, buf, sizeof buf, rand_r(&me->rng) % 2);
            CHECK(r == ZCT_E_EMPTY || r == ZCT_E_CLOSED);
        }
        return r == ZCT_E_CLOSED ? r : ZCT_OK;
    }
}

static void *work(void *arg) {
    worker *me = arg;
    for (int s = 0; s < STOPS; s++) {
        int last = s == STOPS - 1 && last_stop_closes;
        for (int i = 0; !me->closed && (last || i < OPS); i++) {
            if (step(me) == ZCT_E_CLOSED) {
                me->closed = 1;
            }
        }
        if (last) {
            break;
        }
        pthread_barrier_wait(&stop);
        pthread_barrier_wait(&go_on);
    }
    return NULL;
}

static int32_t model(int w) {
    int32_t n = 0;
    for (int i = 0; i < THREADS; i++) {
        n += workers[i].local[w];
    }
    return n;
}

/* Runs the threads on target for STOPS stops; check(round, stop) checks the
   counts at each but the last, which closes target under the threads. */
static void run_round(int round, void (*check)(int)) {
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) {
        workers[i] = (worker){i, (unsigned)(round * 7919 + i), {0, 0, 0}, 0};
        CHECK(pthread_create(&t[i], NULL, work, &workers[i]) == 0);
    }
    for (int s = 0; s < STOPS - 1; s++) {
        pthread_barrier_wait(&stop);
        check(round);
        pthread_barrier_wait(&go_on);
    }
    sleep_ms(round % 5); /* then the close, while the threads step */
    if (is_reader) {
        CHECK(zct_stream_reader_close(target) == ZCT_OK);
    } else {
        CHECK(zct_queue_close(target) == ZCT_OK);
    }
    for (int i = 0; i < THREADS; i++) {
        CHECK(pthread_join(t[i], NULL) == 0);
        CHECK(workers[i].closed);
    }
}

/* -- a queue's words ----------------------------------------------------- */

static mapped qm;
static const int32_t keep_arms[3] = {1, 2, 3}; /* the other handle's */

static void check_queue(int round) {
    for (int w = 0; w < 3; w++) {
        uint32_t n = ld32(&qm, waiters_at[w]);
        if (n != (uint32_t)(keep_arms[w] + model(w))) {
            fprintf(stderr, "round %d word %d: %u sleepers counted, the model says %d + %d\n", round, w, n,
                    keep_arms[w], model(w));
        }
        CHECK(n == (uint32_t)(keep_arms[w] + model(w)));
    }
}

static void queue_model(const char *name) {
    zct_handle keep;
    CHECK(zct_queue_create(name, 4096, 0, &keep) == ZCT_OK);
    qm = map_queue(keep);
    uint32_t *word, seen;
    for (int w = 0; w < 3; w++) {
        for (int i = 0; i < keep_arms[w]; i++) {
            CHECK(zct_queue_arm(keep, w, &word, &seen) == ZCT_OK);
        }
    }
    is_reader = 0;
    last_stop_closes = 1;
    for (int round = 0; round < ROUNDS; round++) {
        CHECK(zct_queue_attach(name, 0, &target) == ZCT_OK);
        run_round(round, check_queue);
        for (int w = 0; w < 3; w++) {
            CHECK(ld32(&qm, waiters_at[w]) == (uint32_t)keep_arms[w]); /* the close took back the rest */
            CHECK(zct_queue_arm(target, w, &word, &seen) == ZCT_E_CLOSED);
            CHECK(zct_queue_disarm(target, w, 1) == ZCT_E_CLOSED);
        }
    }
    for (int w = 0; w < 3; w++) {
        for (int i = 0; i < keep_arms[w]; i++) {
            CHECK(zct_queue_disarm(keep, w, i % 2) == ZCT_OK);
        }
        CHECK(zct_queue_disarm(keep, w, 0) == ZCT_E_INVALID);
        CHECK(ld32(&qm, waiters_at[w]) == 0);
    }
    unmap_queue(&qm);
    CHECK(zct_queue_close(keep) == ZCT_OK);
}

/* -- a stream reader's word ---------------------------------------------- */

static zct_handle stream_h;
static zct_stream_info sinfo;
static int32_t keep_index, target_index;

static uint32_t *swaiters(void) { return (uint32_t *)((uint8_t *)sinfo.data + STREAM_DATA_WAITERS); }

static uint32_t *slot_armed(int32_t index) {
    return (uint32_t *)((uint8_t *)sinfo.data + READERS_AT + (uint64_t)index * READER_SIZE + READER_ARMED);
}

static void check_reader(int round) {
    uint32_t n = __atomic_load_n(swaiters(), SEQ), mine = __atomic_load_n(slot_armed(target_index), SEQ);
    if (n != (uint32_t)(2 + model(0)) || mine != (uint32_t)model(0)) {
        fprintf(stderr, "round %d: %u sleepers counted, %u in the slot; the model says 2 + %d\n", round, n, mine,
                model(0));
    }
    CHECK(n == (uint32_t)(2 + model(0)));
    CHECK(mine == (uint32_t)model(0));
    CHECK(__atomic_load_n(slot_armed(keep_index), SEQ) == 2);
}

static void reader_model(const char *name) {
    int64_t shape[1] = {4};
    CHECK(zct_stream_create(name, ZCT_FLOAT32, 1, shape, 4, 2, 0, 0, &stream_h, &sinfo) == ZCT_OK);
    zct_handle keep;
    CHECK(zct_stream_reader(stream_h, -1, &keep, &keep_index) == ZCT_OK);
    uint32_t *word, seen;
    CHECK(zct_stream_reader_arm(keep, &word, &seen) == ZCT_OK);
    CHECK(zct_stream_reader_arm(keep, &word, &seen) == ZCT_OK);
    is_reader = 1;
    last_stop_closes = 1;
    for (int round = 0; round < ROUNDS; round++) {
        CHECK(zct_stream_reader(stream_h, -1, &target, &target_index) == ZCT_OK);
        if (round % 3 == 1) {
            CHECK(zct_stream_reader_set_wait(target, 1, 200000) == ZCT_OK); /* looks in Go */
        }
        run_round(round, check_reader);
        CHECK(__atomic_load_n(swaiters(), SEQ) == 2); /* keep's */
        CHECK(__atomic_load_n(slot_armed(keep_index), SEQ) == 2);
        CHECK(zct_stream_reader_arm(target, &word, &seen) == ZCT_E_CLOSED);
        CHECK(zct_stream_reader_disarm(target) == ZCT_E_CLOSED);
    }
    CHECK(zct_stream_reader_disarm(keep) == ZCT_OK);
    CHECK(zct_stream_reader_disarm(keep) == ZCT_OK);
    CHECK(zct_stream_reader_disarm(keep) == ZCT_E_INVALID);
    CHECK(__atomic_load_n(swaiters(), SEQ) == 0);
    CHECK(zct_stream_reader_close(keep) == ZCT_OK);
    CHECK(zct_stream_close(stream_h) == ZCT_OK);
}

/* -- forged counts ------------------------------------------------------- */

static const uint32_t forged[] = {0, 1, 1u << 31, UINT32_MAX};
enum { NFORGED = sizeof forged / sizeof forged[0] };

typedef struct {
    int32_t *armed;         /* set once armed */
    int slept;              /* what the sleep ended with */
    zct_handle h;
} sleeper;

static void *sleep_on_queue(void *arg) {
    sleeper *s = arg;
    uint32_t *word, seen;
    CHECK(zct_queue_arm(s->h, ZCT_WAIT_DATA, &word, &seen) == ZCT_OK);
    __atomic_store_n(s->armed, 1, SEQ);
    int64_t until = now_ns() + WAKE_MS * 1000000LL;
    do { /* a signal (the Go runtime's preemption signal) ends a sleep early */
        s->slept = zct_sleep(word, seen, (until - now_ns()) / 1000000 + 1);
    } while (s->slept == ZCT_E_INTERRUPTED);
    CHECK(zct_queue_disarm(s->h, ZCT_WAIT_DATA, 0) == ZCT_OK);
    return NULL;
}

static void *sleep_on_reader(void *arg) {
    sleeper *s = arg;
    uint32_t *word, seen;
    CHECK(zct_stream_reader_arm(s->h, &word, &seen) == ZCT_OK);
    __atomic_store_n(s->armed, 1, SEQ);
    int64_t until = now_ns() + WAKE_MS * 1000000LL;
    do {
        s->slept = zct_sleep(word, seen, (until - now_ns()) / 1000000 + 1);
    } while (s->slept == ZCT_E_INTERRUPTED);
    CHECK(zct_stream_reader_disarm(s->h) == ZCT_OK);
    return NULL;
}

/* A count is at most what was forged there plus the arms made since:
   never wrapped round below zero. */
static void not_wrapped(uint32_t n, uint32_t forged_value, uint32_t arms) {
    CHECK(n <= forged_value || n - forged_value <= arms);
}

static void forged_queue_counts(const char *name) {
    zct_handle q;
    CHECK(zct_queue_create(name, 4096, 0, &q) == ZCT_OK);
    mapped m = map_queue(q);
    for (int f = 0; f < NFORGED; f++) {
        /* A disarm after the count was forged never wraps it round. */
        uint32_t *word, seen;
        CHECK(zct_queue_arm(q, ZCT_WAIT_DATA, &word, &seen) == ZCT_OK);
        CHECK(zct_queue_arm(q, ZCT_WAIT_SPACE, &word, &seen) == ZCT_OK);
        st32(&m, DATA_WAITERS, forged[f]);
        st32(&m, SPACE_WAITERS, forged[f]);
        CHECK(zct_queue_disarm(q, ZCT_WAIT_DATA, 1) == ZCT_OK);
        CHECK(zct_queue_disarm(q, ZCT_WAIT_SPACE, 0) == ZCT_OK);
        not_wrapped(ld32(&m, DATA_WAITERS), forged[f], 0);
        not_wrapped(ld32(&m, SPACE_WAITERS), forged[f], 0);

        /* A sleeper armed after the forgery is woken by a put. */
        st32(&m, DATA_WAITERS, forged[f]);
        int32_t armed = 0;
        sleeper s = {&armed, 1, q};
        pthread_t t;
        CHECK(pthread_create(&t, NULL, sleep_on_queue, &s) == 0);
        while (!__atomic_load_n(&armed, SEQ)) {
            sleep_ms(1);
        }
        /* A put wakes sleepers only when the count says there are some. */
        if (ld32(&m, DATA_WAITERS) == 0) {
            fprintf(stderr, "waiters forged to %u: an arm left the count at 0\n", forged[f]);
        }
        CHECK(ld32(&m, DATA_WAITERS) != 0);
        sleep_ms(50); /* asleep by now, most likely: a put then must wake it */
        CHECK(zct_queue_put(q, ZCT_RECORD_BYTES, "wake", 4, NULL, 0, 0) == ZCT_OK);
        CHECK(pthread_join(t, NULL) == 0);
        if (s.slept != ZCT_OK) {
            fprintf(stderr, "waiters forged to %u: the sleeper armed after it slept to its timeout (%d)\n", forged[f],
                    s.slept);
        }
        CHECK(s.slept == ZCT_OK);
        not_wrapped(ld32(&m, DATA_WAITERS), forged[f], 1);
        uint8_t buf[64];
        CHECK(take_plain(q, buf, sizeof buf, 0) == 4);
        st32(&m, DATA_WAITERS, 0);
        st32(&m, SPACE_WAITERS, 0);
    }
    /* A close that takes back arms over a forged count never wraps it. */
    for (int f = 0; f < NFORGED; f++) {
        zct_handle h;
        CHECK(zct_queue_attach(name, 0, &h) == ZCT_OK);
        uint32_t *word, seen;
        for (int i = 0; i < 3; i++) {
            CHECK(zct_queue_arm(h, ZCT_WAIT_JOIN, &word, &seen) == ZCT_OK);
        }
        st32(&m, JOIN_WAITERS, forged[f]);
        CHECK(zct_queue_close(h) == ZCT_OK);
        not_wrapped(ld32(&m, JOIN_WAITERS), forged[f], 0);
    }
    unmap_queue(&m);
    CHECK(zct_queue_close(q) == ZCT_OK);
}

static void forged_reader_counts(const char *name) {
    int64_t shape[1] = {4};
    CHECK(zct_stream_create(name, ZCT_FLOAT32, 1, shape, 4, 2, 0, 0, &stream_h, &sinfo) == ZCT_OK);
    zct_handle w, r;
    int32_t index;
    CHECK(zct_stream_writer(stream_h, &w) == ZCT_OK);
    CHECK(zct_stream_reader(stream_h, -1, &r, &index) == ZCT_OK);
    for (int f = 0; f < NFORGED; f++) {
        for (int g = 0; g < NFORGED; g++) {
            /* The word's count forged to f, the slot's to g. */
            uint32_t *word, seen;
            CHECK(zct_stream_reader_arm(r, &word, &seen) == ZCT_OK);
            __atomic_store_n(swaiters(), forged[f], SEQ);
            __atomic_store_n(slot_armed(index), forged[g], SEQ);
            CHECK(zct_stream_reader_disarm(r) == ZCT_OK);
            not_wrapped(__atomic_load_n(swaiters(), SEQ), forged[f], 0);
            not_wrapped(__atomic_load_n(slot_armed(index), SEQ), forged[g], 0);

            __atomic_store_n(swaiters(), forged[f], SEQ);
            __atomic_store_n(slot_armed(index), forged[g], SEQ);
            int32_t armed = 0;
            sleeper s = {&armed, 1, r};
            pthread_t t;
            CHECK(pthread_create(&t, NULL, sleep_on_reader, &s) == 0);
            while (!__atomic_load_n(&armed, SEQ)) {
                sleep_ms(1);
            }
            if (__atomic_load_n(swaiters(), SEQ) == 0) {
                fprintf(stderr, "counts forged to %u and %u: an arm left the word's count at 0\n", forged[f],
                        forged[g]);
            }
            CHECK(__atomic_load_n(swaiters(), SEQ) != 0); /* else a publish wakes no one */
            sleep_ms(50);
            int32_t slot = -1, whole = 0;
            CHECK(zct_stream_write_look(w, WAKE_MS, &slot) == ZCT_OK);
            CHECK(zct_stream_write_increment(w) == ZCT_OK);
            CHECK(pthread_join(t, NULL) == 0);
            if (s.slept != ZCT_OK) {
                fprintf(stderr, "counts forged to %u and %u: the reader armed after it slept to its timeout (%d)\n",
                        forged[f], forged[g], s.slept);
            }
            CHECK(s.slept == ZCT_OK);
            not_wrapped(__atomic_load_n(swaiters(), SEQ), forged[f], 1);
            not_wrapped(__atomic_load_n(slot_armed(index), SEQ), forged[g], 1);
            CHECK(zct_stream_read_next(r, 0, &slot, &whole) == ZCT_OK);
            CHECK(zct_stream_read_increment(r, &whole) == ZCT_OK && whole == 1);
            __atomic_store_n(swaiters(), 0, SEQ);
            __atomic_store_n(slot_armed(index), 0, SEQ);
        }
    }
    CHECK(zct_stream_reader_close(r) == ZCT_OK);
    CHECK(zct_stream_writer_close(w) == ZCT_OK);
    CHECK(zct_stream_close(stream_h) == ZCT_OK);
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    CHECK(pthread_barrier_init(&stop, NULL, THREADS + 1) == 0);
    CHECK(pthread_barrier_init(&go_on, NULL, THREADS + 1) == 0);
    char name[256];
    snprintf(name, sizeof name, "%s-q", argv[1]);
    queue_model(name);
    snprintf(name, sizeof name, "%s-s", argv[1]);
    reader_model(name);
    snprintf(name, sizeof name, "%s-fq", argv[1]);
    forged_queue_counts(name);
    snprintf(name, sizeof name, "%s-fs", argv[1]);
    forged_reader_counts(name);
    printf("ok\n");
    return 0;
}
