// The waits that poll in C, and a stream reader's arms counted in C
// (fast.c): a take or a look of the policy that polls for ever waits in
// C without entering Go, the other policies wait in Go, and
// zct_stream_reader_arm and _disarm count a sleeper on the stream's data
// word. Attacked here: timeouts of 0, 1 ms, 200 ms, negative and past the
// clock's range under every poll policy; policies switched by another
// thread while a take or a look waits, whose calls on the reader are not
// starved by a look that waits again and again; a close while pollers
// wait on the handle; more pollers than cores on one queue and on one
// reader, each message and frame taken once; arms and disarms from many
// threads, out of balance, after a close and through forged or other
// kinds' handles; a close while threads sleep on the armed word; a reader
// killed while armed; a file shrunk under pollers and under an armed
// reader. A hang is caught by a watchdog (SIGALRM). It prints "ok" when
// every check passes.
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include "mapped.h"
#include "clock.h"

#define SEQ __ATOMIC_SEQ_CST
#define STREAM_DATA_WORD 384
#define STREAM_DATA_WAITERS 388
#define HANG_NS (10 * 1000000000LL) /* far above what a call needs: only a hang or a starved call reaches it */

/* The wait policies of zct_queue_set_wait and zct_stream_reader_set_wait
   that poll: for ever (in C, whatever the negative spin), and for a while
   before sleeping (in Go). */
typedef struct {
    int32_t poll;
    int64_t spin_ns;
} policy;

static const policy polls[] = {{1, -1}, {1, -9}, {1, INT64_MIN}, {1, 0}, {1, 2000000}, {1, INT64_MAX}};
enum { NPOLLS = sizeof polls / sizeof polls[0] };

/* Timeouts that wait for ever: negative, or too long to add to the clock. */
static const int64_t for_ever[] = {-1, -7, INT64_MIN, INT64_MAX, INT64_MAX / 1000000 + 1, INT64_MAX / 1000000 - 1,
                                   INT64_MAX / 2};
enum { NFOREVER = sizeof for_ever / sizeof for_ever[0] };

/* -- a stream ------------------------------------------------------------ */

typedef struct {
    zct_handle s;
    zct_stream_info info;
} stream;

static stream make_stream(const char *name, int32_t frames, int32_t readers) {
    stream st;
    int64_t shape[1] = {4};
    CHECK(zct_stream_create(name, ZCT_FLOAT32, 1, shape, frames, readers, 0, 0, &st.s, &st.info) == ZCT_OK);
    return st;
}

static uint32_t *stream_word(const stream *st, int off) { return (uint32_t *)((uint8_t *)st->info.data + off); }

static uint32_t sleepers(const stream *st) { return __atomic_load_n(stream_word(st, STREAM_DATA_WAITERS), SEQ); }

static float *frame(const stream *st, int32_t slot) {
    return (float *)((uint8_t *)st->info.data + st->info.ring_offset + (uint64_t)slot * st->info.stride);
}

static zct_handle join(const stream *st) {
    zct_handle r;
    int32_t index;
    CHECK(zct_stream_reader(st->s, -1, &r, &index) == ZCT_OK);
    return r;
}

static void publish(const stream *st, zct_handle w, float value) {
    int32_t slot = -1;
    CHECK(zct_stream_write_look(w, 30000, &slot) == ZCT_OK);
    for (int i = 0; i < 4; i++) {
        frame(st, slot)[i] = value;
    }
    CHECK(zct_stream_write_increment(w) == ZCT_OK);
}

static char *shm_path(const char *name, char *path, size_t cap) {
    const char *dir = getenv("ZCTIPC_SHM_DIR");
    snprintf(path, cap, "%s/%s", dir ? dir : "/dev/shm", name);
    return path;
}

/* -- timeouts ------------------------------------------------------------ */

static zct_handle queue;

static void *put_later(void *arg) {
    sleep_ms((int64_t)(intptr_t)arg);
    CHECK(zct_queue_put(queue, ZCT_RECORD_BYTES, "late", 4, NULL, 0, 0) == ZCT_OK);
    return NULL;
}

/* A take that finds nothing within timeout_ms says so after it, and well
   before a hang. */
static void waited_out(int64_t (*call)(int64_t), int64_t timeout_ms) {
    int64_t start = now_ns();
    CHECK(call(timeout_ms) == ZCT_E_EMPTY);
    int64_t took = now_ns() - start;
    CHECK(took >= timeout_ms * 1000000LL);
    CHECK(took < HANG_NS / 2);
}

static int64_t take_now(int64_t timeout_ms) {
    uint8_t buf[64];
    return take_plain(queue, buf, sizeof buf, timeout_ms);
}

static void queue_timeouts(void) {
    CHECK(zct_queue_create(NULL, 4096, 0, &queue) == ZCT_OK);
    for (int p = 0; p < NPOLLS; p++) {
        CHECK(zct_queue_set_wait(queue, polls[p].poll, polls[p].spin_ns) == ZCT_OK);
        waited_out(take_now, 0);
        waited_out(take_now, 1);
        waited_out(take_now, 200);
        for (int i = 0; i < NFOREVER; i++) {
            pthread_t t;
            CHECK(pthread_create(&t, NULL, put_later, (void *)(intptr_t)50) == 0);
            CHECK(take_now(for_ever[i]) == 4);
            CHECK(pthread_join(t, NULL) == 0);
        }
        /* A message there is taken at once, whatever the timeout. */
        CHECK(zct_queue_put(queue, ZCT_RECORD_BYTES, "here", 4, NULL, 0, 0) == ZCT_OK);
        CHECK(take_now(INT64_MIN) == 4);
    }
    /* Policies the library refuses leave the handle's as it was. */
    CHECK(zct_queue_set_wait(queue, 2, -1) == ZCT_E_INVALID);
    CHECK(zct_queue_set_wait(queue, -1, -1) == ZCT_E_INVALID);
    waited_out(take_now, 50);
    CHECK(zct_queue_close(queue) == ZCT_OK);
}

static stream tstream;
static zct_handle treader, twriter;

static void *publish_later(void *arg) {
    sleep_ms(50);
    publish(&tstream, twriter, (float)(intptr_t)arg);
    return NULL;
}

static int64_t look_now(int64_t timeout_ms) {
    int32_t slot = -1;
    return zct_stream_read_look(treader, timeout_ms, &slot);
}

static void reader_timeouts(void) {
    tstream = make_stream(NULL, 4, 1);
    treader = join(&tstream);
    CHECK(zct_stream_writer(tstream.s, &twriter) == ZCT_OK);
    int value = 0;
    for (int p = 0; p < NPOLLS; p++) {
        CHECK(zct_stream_reader_set_wait(treader, polls[p].poll, polls[p].spin_ns) == ZCT_OK);
        waited_out(look_now, 0);
        waited_out(look_now, 1);
        waited_out(look_now, 200);
        for (int i = 0; i < NFOREVER; i++) {
            pthread_t t;
            CHECK(pthread_create(&t, NULL, publish_later, (void *)(intptr_t)++value) == 0);
            int32_t slot = -1, whole = 0;
            CHECK(zct_stream_read_next(treader, for_ever[i], &slot, &whole) == ZCT_OK && whole == 1);
            CHECK(frame(&tstream, slot)[0] == (float)value);
            CHECK(pthread_join(t, NULL) == 0);
        }
        int32_t whole = 0;
        CHECK(zct_stream_read_increment(treader, &whole) == ZCT_OK && whole == 1);
    }
    uint64_t position, received, dropped;
    CHECK(zct_stream_reader_stats(treader, &position, &received, &dropped) == ZCT_OK);
    CHECK(position == (uint64_t)value && received == (uint64_t)value && dropped == 0);
    CHECK(sleepers(&tstream) == 0);
    CHECK(zct_stream_writer_close(twriter) == ZCT_OK);
    CHECK(zct_stream_reader_close(treader) == ZCT_OK);
    CHECK(zct_stream_close(tstream.s) == ZCT_OK);
}

/* -- policies switched while a take or a look waits ---------------------- */

/* sleep (C), poll for ever (C), spin then sleep (Go), poll a while then
   sleep (Go), and sleep again. */
static const policy cycle[] = {{0, -1}, {1, -1}, {0, 20000}, {1, 100000}, {0, -1}};
enum { NCYCLE = sizeof cycle / sizeof cycle[0], SWITCH_ROUNDS = 40 };

static void *take_all(void *arg) {
    int n = (int)(intptr_t)arg;
    for (int i = 0; i < n; i++) {
        uint8_t buf[64];
        CHECK(take_plain(queue, buf, sizeof buf, -1) == 4);
        uint32_t v;
        memcpy(&v, buf + ZCT_RECORD_HEADER, 4);
        CHECK(v == (uint32_t)i);
    }
    return NULL;
}

static void queue_switches(void) {
    CHECK(zct_queue_create(NULL, 4096, 0, &queue) == ZCT_OK);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, take_all, (void *)(intptr_t)SWITCH_ROUNDS) == 0);
    unsigned seed = 11;
    for (uint32_t round = 0; round < SWITCH_ROUNDS; round++) {
        int put_at = rand_r(&seed) % NCYCLE;
        for (int k = 0; k < NCYCLE; k++) {
            CHECK(zct_queue_set_wait(queue, cycle[k].poll, cycle[k].spin_ns) == ZCT_OK);
            sleep_ms(rand_r(&seed) % 3);
            if (k == put_at) {
                CHECK(zct_queue_put(queue, ZCT_RECORD_BYTES, &round, 4, NULL, 0, 0) == ZCT_OK);
            }
        }
    }
    CHECK(pthread_join(t, NULL) == 0);
    CHECK(zct_queue_close(queue) == ZCT_OK);
}

/* A reader that looks again and again, each look waiting a while in C (as
   Python's waits do, in slices), holds the reader through each look: the
   calls of another thread on it (set_wait, stats) wait for one look, not
   for ever. */
static volatile int looks_go_on;

static void *look_in_slices(void *arg) {
    (void)arg;
    float expect = 1;
    while (__atomic_load_n(&looks_go_on, SEQ)) {
        int32_t slot = -1, whole = 0;
        int r = zct_stream_read_next(treader, 20, &slot, &whole);
        CHECK(r == ZCT_OK || r == ZCT_E_EMPTY);
        if (r == ZCT_OK) {
            CHECK(whole == 1 && frame(&tstream, slot)[0] == expect);
            expect++;
        }
    }
    return NULL;
}

static void reader_switches(void) {
    tstream = make_stream(NULL, 4, 1);
    treader = join(&tstream);
    CHECK(zct_stream_writer(tstream.s, &twriter) == ZCT_OK);
    looks_go_on = 1;
    pthread_t t;
    CHECK(pthread_create(&t, NULL, look_in_slices, NULL) == 0);
    for (int round = 0; round < 8; round++) {
        for (int k = 0; k < NCYCLE; k++) {
            int64_t start = now_ns();
            CHECK(zct_stream_reader_set_wait(treader, cycle[k].poll, cycle[k].spin_ns) == ZCT_OK);
            uint64_t position, received, dropped;
            CHECK(zct_stream_reader_stats(treader, &position, &received, &dropped) == ZCT_OK);
            CHECK(now_ns() - start < HANG_NS); /* starved by the looks, it waited for ever */
            sleep_ms(5);
        }
        publish(&tstream, twriter, (float)(round + 1));
    }
    __atomic_store_n(&looks_go_on, 0, SEQ);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK(sleepers(&tstream) == 0);
    CHECK(zct_stream_writer_close(twriter) == ZCT_OK);
    CHECK(zct_stream_reader_close(treader) == ZCT_OK);
    CHECK(zct_stream_close(tstream.s) == ZCT_OK);
}

/* -- a close while pollers wait ------------------------------------------ */

static zct_handle target;

static void *take_for_ever(void *arg) {
    uint8_t buf[64];
    *(int64_t *)arg = take_plain(target, buf, sizeof buf, -1);
    return NULL;
}

static void *look_for_ever(void *arg) {
    int32_t slot;
    *(int64_t *)arg = zct_stream_read_look(target, -1, &slot);
    return NULL;
}

enum { CLOSE_ROUNDS = 12, CLOSE_THREADS = 6 };

static void close_under_pollers(const char *name) {
    zct_handle other;
    CHECK(zct_queue_create(name, 4096, 0, &other) == ZCT_OK);
    mapped m = map_queue(other);
    for (int round = 0; round < CLOSE_ROUNDS; round++) {
        const policy *p = &polls[round % NPOLLS];
        CHECK(zct_queue_attach(name, 0, &target) == ZCT_OK);
        CHECK(zct_queue_set_wait(target, p->poll, p->spin_ns) == ZCT_OK);
        pthread_t t[CLOSE_THREADS];
        int64_t r[CLOSE_THREADS];
        for (int i = 0; i < CLOSE_THREADS; i++) {
            CHECK(pthread_create(&t[i], NULL, take_for_ever, &r[i]) == 0);
        }
        sleep_ms(20 + round % 4 * 10);
        int64_t start = now_ns();
        CHECK(zct_queue_close(target) == ZCT_OK);
        for (int i = 0; i < CLOSE_THREADS; i++) {
            CHECK(pthread_join(t[i], NULL) == 0);
            CHECK(r[i] == ZCT_E_CLOSED);
        }
        CHECK(now_ns() - start < HANG_NS);
        CHECK(ld32(&m, DATA_WAITERS) == 0);
        /* The queue is whole: the other handle's messages flow. */
        CHECK(zct_queue_put(other, ZCT_RECORD_BYTES, "next", 4, NULL, 0, 0) == ZCT_OK);
        uint8_t buf[64];
        CHECK(take_plain(other, buf, sizeof buf, 0) == 4);
    }
    unmap_queue(&m);
    CHECK(zct_queue_close(other) == ZCT_OK);

    /* One reader handle: a thread polls in C, the others wait for it in Go. */
    stream st = make_stream(NULL, 4, 2);
    zct_handle keep = join(&st);
    uint32_t *word, seen;
    CHECK(zct_stream_reader_arm(keep, &word, &seen) == ZCT_OK);
    for (int round = 0; round < CLOSE_ROUNDS; round++) {
        const policy *p = &polls[round % NPOLLS];
        target = join(&st);
        CHECK(zct_stream_reader_set_wait(target, p->poll, p->spin_ns) == ZCT_OK);
        pthread_t t[CLOSE_THREADS];
        int64_t r[CLOSE_THREADS];
        for (int i = 0; i < CLOSE_THREADS; i++) {
            CHECK(pthread_create(&t[i], NULL, look_for_ever, &r[i]) == 0);
        }
        sleep_ms(20 + round % 4 * 10);
        int64_t start = now_ns();
        CHECK(zct_stream_reader_close(target) == ZCT_OK);
        for (int i = 0; i < CLOSE_THREADS; i++) {
            CHECK(pthread_join(t[i], NULL) == 0);
            CHECK(r[i] == ZCT_E_CLOSED);
        }
        CHECK(now_ns() - start < HANG_NS);
        CHECK(sleepers(&st) == 1); /* keep's arm */
        int32_t slot;
        CHECK(zct_stream_read_look(target, 0, &slot) == ZCT_E_CLOSED);
    }
    CHECK(zct_stream_reader_disarm(keep) == ZCT_OK);
    CHECK(sleepers(&st) == 0);
    CHECK(zct_stream_reader_close(keep) == ZCT_OK);
    CHECK(zct_stream_close(st.s) == ZCT_OK);
}

/* -- more pollers than cores --------------------------------------------- */

enum { POLLERS = 12, EACH = 300, MESSAGES = POLLERS * EACH };
static int taken[MESSAGES];

static void *take_until_stop(void *arg) {
    (void)arg;
    for (;;) {
        uint8_t buf[64];
        CHECK(take_plain(queue, buf, sizeof buf, -1) == 4);
        uint32_t v;
        memcpy(&v, buf + ZCT_RECORD_HEADER, 4);
        if (v == UINT32_MAX) {
            return NULL;
        }
        CHECK(v < MESSAGES);
        __atomic_add_fetch(&taken[v], 1, SEQ);
    }
}

static void many_queue_pollers(const policy *p) {
    CHECK(zct_queue_create(NULL, 4096, 0, &queue) == ZCT_OK);
    CHECK(zct_queue_set_wait(queue, p->poll, p->spin_ns) == ZCT_OK);
    memset(taken, 0, sizeof taken);
    pthread_t t[POLLERS];
    for (int i = 0; i < POLLERS; i++) {
        CHECK(pthread_create(&t[i], NULL, take_until_stop, NULL) == 0);
    }
    for (uint32_t v = 0; v < MESSAGES + POLLERS; v++) {
        uint32_t m = v < MESSAGES ? v : UINT32_MAX;
        CHECK(zct_queue_put(queue, ZCT_RECORD_BYTES, &m, 4, NULL, 0, -1) == ZCT_OK);
    }
    for (int i = 0; i < POLLERS; i++) {
        CHECK(pthread_join(t[i], NULL) == 0);
    }
    for (int v = 0; v < MESSAGES; v++) {
        CHECK(taken[v] == 1);
    }
    CHECK(take_now(0) == ZCT_E_EMPTY);
    mapped m = map_queue(queue);
    CHECK(ld32(&m, DATA_WAITERS) == 0);
    unmap_queue(&m);
    CHECK(zct_queue_close(queue) == ZCT_OK);
}

/* Threads that share one reader: each frame goes to one of them, as the
   reader's position says (a read_next releases the frame another thread
   looked at, and looks at the next). */
static int frames_seen;

static void *next_until_end(void *arg) {
    (void)arg;
    for (;;) {
        int32_t slot = -1, whole = 0;
        int r = zct_stream_read_next(treader, -1, &slot, &whole);
        if (r == ZCT_E_INTERRUPTED) {
            continue; /* a signal (the Go runtime's own): call again, as zctipc.h says */
        }
        if (r == ZCT_E_ENDED) {
            return NULL;
        }
        CHECK(r == ZCT_OK && whole == 1);
        __atomic_add_fetch(&frames_seen, 1, SEQ);
    }
}

/* Threads with a reader each: every frame, in order, to each. */
static void *read_own(void *arg) {
    zct_handle r = (zct_handle)(uintptr_t)arg;
    for (float expect = 0;; expect++) {
        int32_t slot = -1, whole = 0;
        int k = zct_stream_read_next(r, -1, &slot, &whole);
        if (k == ZCT_E_INTERRUPTED) {
            expect--; /* a signal (the Go runtime's own): call again, as zctipc.h says */
            continue;
        }
        if (k == ZCT_E_ENDED) {
            CHECK(expect == 1000);
            return NULL;
        }
        CHECK(k == ZCT_OK && whole == 1);
        CHECK(frame(&tstream, slot)[0] == expect);
    }
}

static void many_reader_pollers(const policy *p) {
    enum { FRAMES = 1000, OWN = 6 };
    tstream = make_stream(NULL, 8, OWN + 1);
    treader = join(&tstream);
    CHECK(zct_stream_reader_set_wait(treader, p->poll, p->spin_ns) == ZCT_OK);
    CHECK(zct_stream_writer(tstream.s, &twriter) == ZCT_OK);
    frames_seen = 0;
    pthread_t t[POLLERS], own[OWN];
    zct_handle owners[OWN];
    for (int i = 0; i < POLLERS; i++) {
        CHECK(pthread_create(&t[i], NULL, next_until_end, NULL) == 0);
    }
    for (int i = 0; i < OWN; i++) {
        owners[i] = join(&tstream);
        CHECK(zct_stream_reader_set_wait(owners[i], p->poll, p->spin_ns) == ZCT_OK);
        CHECK(pthread_create(&own[i], NULL, read_own, (void *)(uintptr_t)owners[i]) == 0);
    }
    for (int i = 0; i < FRAMES; i++) {
        publish(&tstream, twriter, (float)i);
    }
    CHECK(zct_stream_end(tstream.s) == ZCT_OK);
    for (int i = 0; i < POLLERS; i++) {
        CHECK(pthread_join(t[i], NULL) == 0);
    }
    for (int i = 0; i < OWN; i++) {
        CHECK(pthread_join(own[i], NULL) == 0);
        CHECK(zct_stream_reader_close(owners[i]) == ZCT_OK);
    }
    CHECK(frames_seen == FRAMES);
    uint64_t position, received, dropped;
    CHECK(zct_stream_reader_stats(treader, &position, &received, &dropped) == ZCT_OK);
    CHECK(position == FRAMES && received == FRAMES && dropped == 0);
    CHECK(sleepers(&tstream) == 0);
    CHECK(zct_stream_writer_close(twriter) == ZCT_OK);
    CHECK(zct_stream_reader_close(treader) == ZCT_OK);
    CHECK(zct_stream_close(tstream.s) == ZCT_OK);
}

/* -- a reader's arms ----------------------------------------------------- */

/* Threads arm and disarm two readers of one stream, once or twice at a
   time, while another looks (which arms in C itself) and the writer
   publishes: every disarm of an arm is taken, and the count on the data
   word never wraps and comes back to exactly 0. */
static zct_handle arm_readers[2];
static volatile int arming;

static void *arm_disarm(void *arg) {
    long id = (long)arg;
    zct_handle r = arm_readers[id % 2];
    for (int i = 0; i < 3000; i++) {
        uint32_t *word = NULL, seen = 0;
        int n = 1 + (int)((id + i) % 2);
        for (int k = 0; k < n; k++) {
            CHECK(zct_stream_reader_arm(r, &word, &seen) == ZCT_OK);
            CHECK(word == stream_word(&tstream, STREAM_DATA_WORD));
        }
        if (i % 64 == 0) {
            int k = zct_sleep(word, seen, 0);
            CHECK(k == ZCT_OK || k == ZCT_E_EMPTY || k == ZCT_E_INTERRUPTED); /* a signal: the Go runtime's */
        }
        for (int k = 0; k < n; k++) {
            CHECK(zct_stream_reader_disarm(r) == ZCT_OK);
        }
    }
    return NULL;
}

static void *look_while_arming(void *arg) {
    (void)arg;
    while (__atomic_load_n(&arming, SEQ)) {
        int32_t slot, whole;
        int r = zct_stream_read_next(arm_readers[0], 2, &slot, &whole);
        CHECK(r == ZCT_OK || r == ZCT_E_EMPTY);
    }
    return NULL;
}

static void arm_storm(void) {
    enum { THREADS = 16 };
    tstream = make_stream(NULL, 4, 2);
    arm_readers[0] = join(&tstream);
    arm_readers[1] = join(&tstream);
    CHECK(zct_stream_writer(tstream.s, &twriter) == ZCT_OK);
    arming = 1;
    pthread_t t[THREADS], looker;
    CHECK(pthread_create(&looker, NULL, look_while_arming, NULL) == 0);
    for (long i = 0; i < THREADS; i++) {
        CHECK(pthread_create(&t[i], NULL, arm_disarm, (void *)i) == 0);
    }
    /* The count never goes below 0 (a wrap to 2^32 - 1): at most each
       thread's two arms and the looker's. */
    int32_t slot;
    for (int i = 0; i < 200; i++) {
        CHECK(sleepers(&tstream) <= 2 * THREADS + 1);
        if (i % 10 == 0 && zct_stream_write_look(twriter, 0, &slot) == ZCT_OK) {
            frame(&tstream, slot)[0] = (float)i;
            CHECK(zct_stream_write_increment(twriter) == ZCT_OK);
        }
        sleep_ms(1);
    }
    for (int i = 0; i < THREADS; i++) {
        CHECK(pthread_join(t[i], NULL) == 0);
    }
    __atomic_store_n(&arming, 0, SEQ);
    CHECK(pthread_join(looker, NULL) == 0);
    CHECK(sleepers(&tstream) == 0);
    for (int i = 0; i < 2; i++) {
        CHECK(zct_stream_reader_disarm(arm_readers[i]) == ZCT_E_INVALID);
        CHECK(zct_stream_reader_close(arm_readers[i]) == ZCT_OK);
    }
    CHECK(zct_stream_writer_close(twriter) == ZCT_OK);
    CHECK(zct_stream_close(tstream.s) == ZCT_OK);
}

/* Every arm and disarm call on h says ZCT_E_CLOSED, and changes no count. */
static void refused_reader(const stream *st, zct_handle h) {
    uint32_t before = sleepers(st), *word = NULL, seen = 0;
    CHECK(zct_stream_reader_arm(h, &word, &seen) == ZCT_E_CLOSED);
    CHECK(zct_stream_reader_disarm(h) == ZCT_E_CLOSED);
    CHECK(sleepers(st) == before);
}

/* Arms out of balance, after a close, through forged and other kinds'
   handles, and a reader's handle passed where a queue's or a writer's is
   due: refused, and no count moves but the arms taken. */
static void arm_misuse(void) {
    stream st = make_stream(NULL, 4, 2);
    zct_handle r = join(&st), other = join(&st), w;
    CHECK(zct_stream_writer(st.s, &w) == ZCT_OK);
    uint32_t *word = NULL, seen = 0;

    CHECK(zct_stream_reader_disarm(r) == ZCT_E_INVALID); /* never armed */
    CHECK(sleepers(&st) == 0);
    for (int i = 0; i < 3; i++) {
        CHECK(zct_stream_reader_arm(r, &word, &seen) == ZCT_OK);
    }
    CHECK(sleepers(&st) == 3);
    for (int i = 0; i < 5; i++) {
        CHECK(zct_stream_reader_disarm(r) == (i < 3 ? ZCT_OK : ZCT_E_INVALID));
    }
    CHECK(sleepers(&st) == 0);
    CHECK(zct_stream_reader_arm(r, NULL, &seen) == ZCT_E_INVALID);
    CHECK(zct_stream_reader_arm(r, &word, NULL) == ZCT_E_INVALID);
    CHECK(sleepers(&st) == 0);

    /* Arms are the handle's, not the caller's: another handle's disarm
       takes none of them. */
    CHECK(zct_stream_reader_arm(r, &word, &seen) == ZCT_OK);
    CHECK(zct_stream_reader_disarm(other) == ZCT_E_INVALID);
    CHECK(sleepers(&st) == 1);

    /* Handles of no reader: forged, of other kinds (a queue's, the
       writer's, the stream's), and a queue's with arms of its own, which
       a reader's disarm must not take. */
    zct_handle q;
    CHECK(zct_queue_create(NULL, 4096, 0, &q) == ZCT_OK);
    mapped m = map_queue(q);
    CHECK(zct_queue_arm(q, ZCT_WAIT_DATA, &word, &seen) == ZCT_OK);
    zct_handle forged[] = {0, UINT64_MAX, UINT64_MAX - 1, (zct_handle)1 << 63, q, w, st.s, r ^ ((zct_handle)1 << 40)};
    for (size_t i = 0; i < sizeof forged / sizeof forged[0]; i++) {
        refused_reader(&st, forged[i]);
    }
    for (zct_handle d = 1; d < 32; d++) {
        refused_reader(&st, q + d); /* not yet given */
    }
    CHECK(ld32(&m, DATA_WAITERS) == 1);
    /* A reader's handle where a queue's or a writer's is due. */
    CHECK(zct_queue_arm(r, ZCT_WAIT_DATA, &word, &seen) == ZCT_E_CLOSED);
    CHECK(zct_queue_disarm(r, ZCT_WAIT_DATA, 0) == ZCT_E_CLOSED);
    CHECK(zct_stream_writer_arm(r, &word, &seen) == ZCT_E_CLOSED);
    CHECK(zct_stream_writer_disarm(r) == ZCT_E_CLOSED);
    CHECK(zct_queue_set_wait(r, 1, -1) == ZCT_E_CLOSED);
    CHECK(sleepers(&st) == 1);
    CHECK(zct_queue_disarm(q, ZCT_WAIT_DATA, 0) == ZCT_OK);
    CHECK(ld32(&m, DATA_WAITERS) == 0);
    unmap_queue(&m);
    CHECK(zct_queue_close(q) == ZCT_OK);

    /* A close takes back what the handle left armed, and its handle is
       stale after: refused, whatever it is asked. */
    CHECK(zct_stream_reader_arm(r, &word, &seen) == ZCT_OK);
    CHECK(zct_stream_reader_arm(other, &word, &seen) == ZCT_OK);
    CHECK(sleepers(&st) == 3);
    CHECK(zct_stream_reader_close(r) == ZCT_OK);
    CHECK(sleepers(&st) == 1);
    refused_reader(&st, r);
    CHECK(zct_stream_reader_set_wait(r, 1, -1) == ZCT_E_CLOSED);
    CHECK(zct_stream_reader_close(r) == ZCT_E_CLOSED);
    /* A new reader gets a new handle, which the stale one never reaches. */
    zct_handle again = join(&st);
    CHECK(again != r);
    refused_reader(&st, r);
    CHECK(zct_stream_reader_disarm(again) == ZCT_E_INVALID);
    CHECK(zct_stream_reader_disarm(other) == ZCT_OK);
    CHECK(sleepers(&st) == 0);
    CHECK(zct_stream_reader_close(again) == ZCT_OK);
    CHECK(zct_stream_reader_close(other) == ZCT_OK);
    CHECK(zct_stream_writer_close(w) == ZCT_OK);
    refused_reader(&st, w);
    CHECK(zct_stream_close(st.s) == ZCT_OK);
}

/* Readers past the C table's slots arm through Go: counted alike, and a
   close takes back what they left. */
static void arms_past_the_table(void) {
    enum { QUEUES = 1100 };
    static zct_handle qs[QUEUES];
    for (int i = 0; i < QUEUES; i++) {
        CHECK(zct_queue_create(NULL, 4096, 0, &qs[i]) == ZCT_OK);
    }
    stream st = make_stream(NULL, 4, 2);
    zct_handle r = join(&st), w;
    CHECK(zct_stream_writer(st.s, &w) == ZCT_OK);
    uint32_t *word = NULL, seen = 0;
    CHECK(zct_stream_reader_disarm(r) == ZCT_E_INVALID);
    CHECK(zct_stream_reader_arm(r, &word, &seen) == ZCT_OK);
    CHECK(zct_stream_reader_arm(r, &word, &seen) == ZCT_OK);
    CHECK(word == stream_word(&st, STREAM_DATA_WORD) && sleepers(&st) == 2);
    CHECK(zct_stream_reader_disarm(r) == ZCT_OK);
    CHECK(sleepers(&st) == 1);
    CHECK(zct_stream_reader_set_wait(r, 1, -1) == ZCT_OK);
    publish(&st, w, 5);
    int32_t slot, whole;
    CHECK(zct_stream_read_next(r, 1000, &slot, &whole) == ZCT_OK && frame(&st, slot)[0] == 5);
    CHECK(zct_stream_read_look(r, 30, &slot) == ZCT_OK); /* still looking at it */
    CHECK(zct_stream_read_next(r, 30, &slot, &whole) == ZCT_E_EMPTY);
    CHECK(zct_stream_reader_close(r) == ZCT_OK);
    CHECK(sleepers(&st) == 0);
    refused_reader(&st, r);
    CHECK(zct_stream_writer_close(w) == ZCT_OK);
    CHECK(zct_stream_close(st.s) == ZCT_OK);
    for (int i = 0; i < QUEUES; i++) {
        CHECK(zct_queue_close(qs[i]) == ZCT_OK);
    }
}

/* Threads arm, disarm, look and release on a reader that another thread
   closes under them: each call runs or says closed (a stale handle never
   reaches the reader after), and the close takes back exactly the arms
   left, while another reader's stay. */
static volatile int hammering;

static void *hammer_reader(void *arg) {
    long id = (long)arg;
    while (!__atomic_load_n(&hammering, SEQ)) {
    }
    for (unsigned i = 0;; i++) {
        uint32_t *word, seen;
        int32_t slot, whole;
        int r;
        switch ((id + i) % 6) {
        case 0:
        case 1:
            r = zct_stream_reader_arm(target, &word, &seen);
            CHECK(r == ZCT_OK || r == ZCT_E_CLOSED);
            break;
        case 2:
            r = zct_stream_reader_disarm(target);
            /* Another thread's arm is this one's to take back: a handle's
               arms are counted, not owned. */
            CHECK(r == ZCT_OK || r == ZCT_E_INVALID || r == ZCT_E_CLOSED);
            break;
        case 3:
            r = zct_stream_read_look(target, 0, &slot);
            CHECK(r == ZCT_OK || r == ZCT_E_EMPTY || r == ZCT_E_CLOSED);
            break;
        case 4:
            r = zct_stream_read_next(target, 1, &slot, &whole);
            CHECK(r == ZCT_OK || r == ZCT_E_EMPTY || r == ZCT_E_CLOSED);
            break;
        default:
            r = zct_stream_read_increment(target, &whole);
            CHECK(r == ZCT_OK || r == ZCT_E_INVALID || r == ZCT_E_CLOSED);
        }
        if (r == ZCT_E_CLOSED) {
            return NULL;
        }
    }
}

static void close_under_arms(void) {
    enum { THREADS = 4 };
    stream st = make_stream(NULL, 4, 2);
    zct_handle keep = join(&st);
    uint32_t *word, seen;
    CHECK(zct_stream_reader_arm(keep, &word, &seen) == ZCT_OK);
    CHECK(zct_stream_reader_arm(keep, &word, &seen) == ZCT_OK);
    for (int round = 0; round < 100; round++) {
        target = join(&st);
        if (round % 2) {
            CHECK(zct_stream_reader_set_wait(target, 1, -1) == ZCT_OK);
        }
        hammering = 0;
        pthread_t t[THREADS];
        for (long i = 0; i < THREADS; i++) {
            CHECK(pthread_create(&t[i], NULL, hammer_reader, (void *)i) == 0);
        }
        __atomic_store_n(&hammering, 1, SEQ);
        struct timespec ts = {0, (round % 20) * 50 * 1000};
        nanosleep(&ts, NULL);
        CHECK(zct_stream_reader_close(target) == ZCT_OK);
        for (int i = 0; i < THREADS; i++) {
            CHECK(pthread_join(t[i], NULL) == 0);
        }
        refused_reader(&st, target);
        uint32_t n = sleepers(&st);
        if (n != 2) {
            fprintf(stderr, "round %d: %u sleepers after the close, not keep's 2\n", round, n);
        }
        CHECK(n == 2); /* keep's */
    }
    CHECK(zct_stream_reader_disarm(keep) == ZCT_OK);
    CHECK(zct_stream_reader_disarm(keep) == ZCT_OK);
    CHECK(sleepers(&st) == 0);
    CHECK(zct_stream_reader_close(keep) == ZCT_OK);
    CHECK(zct_stream_close(st.s) == ZCT_OK);
}

/* Threads asleep in zct_sleep on a reader's armed word when the reader
   closes wake (or find the word moved) and end; the close takes back their
   arms, and a look asleep in C on the same handle ends closed. */
typedef struct {
    zct_handle r;
    int slept, disarmed;
} sleeper;

static void *sleep_armed(void *arg) {
    sleeper *s = arg;
    uint32_t *word, seen;
    CHECK(zct_stream_reader_arm(s->r, &word, &seen) == ZCT_OK);
    do { /* a signal (the Go runtime's preemption signal) ends a sleep early */
        s->slept = zct_sleep(word, seen, 30000);
    } while (s->slept == ZCT_E_INTERRUPTED);
    s->disarmed = zct_stream_reader_disarm(s->r);
    return NULL;
}

static void close_under_sleepers(void) {
    enum { SLEEPERS = 6 };
    stream st = make_stream(NULL, 4, 2);
    zct_handle keep = join(&st);
    uint32_t *word, seen;
    CHECK(zct_stream_reader_arm(keep, &word, &seen) == ZCT_OK);
    for (int round = 0; round < 10; round++) {
        zct_handle r = join(&st);
        target = r;
        sleeper s[SLEEPERS];
        pthread_t t[SLEEPERS], looker;
        int64_t looked;
        for (int i = 0; i < SLEEPERS; i++) {
            s[i] = (sleeper){r, 1, 1};
            CHECK(pthread_create(&t[i], NULL, sleep_armed, &s[i]) == 0);
        }
        CHECK(pthread_create(&looker, NULL, look_for_ever, &looked) == 0);
        int64_t start = now_ns();
        while (sleepers(&st) < SLEEPERS + 2) { /* theirs, the look's, keep's */
            CHECK(now_ns() - start < HANG_NS);
            sleep_ms(1);
        }
        sleep_ms(20); /* asleep by now, most likely: either way they must end */
        CHECK(zct_stream_reader_close(r) == ZCT_OK);
        for (int i = 0; i < SLEEPERS; i++) {
            CHECK(pthread_join(t[i], NULL) == 0);
            CHECK(s[i].slept == ZCT_OK);          /* woken, or the word had moved: not its timeout */
            CHECK(s[i].disarmed == ZCT_E_CLOSED); /* the close took it back */
        }
        CHECK(pthread_join(looker, NULL) == 0);
        CHECK(looked == ZCT_E_CLOSED);
        CHECK(now_ns() - start < HANG_NS);
        CHECK(sleepers(&st) == 1);
    }
    CHECK(zct_stream_reader_disarm(keep) == ZCT_OK);
    CHECK(sleepers(&st) == 0);
    CHECK(zct_stream_reader_close(keep) == ZCT_OK);
    CHECK(zct_stream_close(st.s) == ZCT_OK);
}

/* -- a reader killed while armed ----------------------------------------- */

/* The child: a reader of the stream name that arms, says so on fd, and
   waits to be killed. */
static int armed_child(const char *name, int fd) {
    zct_handle s, r;
    zct_stream_info info;
    int32_t index;
    CHECK(zct_stream_attach(name, &s, &info) == ZCT_OK);
    CHECK(zct_stream_reader(s, -1, &r, &index) == ZCT_OK);
    uint32_t *word, seen;
    CHECK(zct_stream_reader_arm(r, &word, &seen) == ZCT_OK);
    CHECK(write(fd, "a", 1) == 1);
    for (;;) {
        pause();
    }
}

/* Another process's reader killed (-9) while armed: the writer evicts it
   and takes its sleeper back (its slot counts it: Note [a dead party's
   sleepers] in package futex), so that no publish wakes anyone for
   nothing after that; the other readers go on, and its slot is taken
   again. */
static void killed_while_armed(const char *self, const char *name) {
    stream st = make_stream(name, 4, 2);
    zct_handle r = join(&st), w;
    CHECK(zct_stream_writer(st.s, &w) == ZCT_OK);
    CHECK(zct_stream_reader_set_wait(r, 1, -1) == ZCT_OK);
    for (int round = 0; round < 3; round++) {
        int fds[2];
        CHECK(pipe(fds) == 0);
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
            char fd[16];
            snprintf(fd, sizeof fd, "%d", fds[1]);
            execl(self, self, "armed-child", name, fd, (char *)NULL);
            _exit(127);
        }
        CHECK(close(fds[1]) == 0);
        char c;
        CHECK(read(fds[0], &c, 1) == 1 && c == 'a');
        CHECK(close(fds[0]) == 0);
        CHECK(sleepers(&st) == 1);
        CHECK(kill(pid, SIGKILL) == 0);
        int status;
        CHECK(waitpid(pid, &status, 0) == pid && WIFSIGNALED(status));
        /* More frames than the ring holds: the dead reader held the
           writer back until evicted. */
        for (int i = 0; i < 12; i++) {
            publish(&st, w, (float)i);
            int32_t slot, whole;
            CHECK(zct_stream_read_next(r, 30000, &slot, &whole) == ZCT_OK && whole == 1);
            CHECK(frame(&st, slot)[0] == (float)i);
        }
        /* The eviction took what it left armed back. */
        CHECK(sleepers(&st) == 0);
    }
    /* Its slot is free again. */
    zct_handle again = join(&st);
    CHECK(zct_stream_reader_close(again) == ZCT_OK);
    int32_t whole;
    CHECK(zct_stream_read_increment(r, &whole) == ZCT_OK);
    CHECK(zct_stream_writer_close(w) == ZCT_OK);
    CHECK(zct_stream_reader_close(r) == ZCT_OK);
    CHECK(zct_stream_close(st.s) == ZCT_OK);
    char path[512];
    CHECK(unlink(shm_path(st.info.name, path, sizeof path)) == 0); /* the dead's counts: the daemon's work, which is off here */
}

/* -- files shrunk under pollers and an armed reader ------------------------ */

static void *take_status(void *arg) {
    uint8_t buf[64];
    *(int64_t *)arg = take_plain(target, buf, sizeof buf, -1);
    return NULL;
}

/* Pollers of each poll policy on a queue and on a reader whose file is
   cut: their calls end with ZCT_E_CORRUPT, not the process. */
static void shrunk_under_pollers(void) {
    for (int p = 0; p < 2; p++) {
        const policy *pol = p == 0 ? &polls[0] : &polls[4]; /* in C, and in Go */
        CHECK(zct_queue_create(NULL, 4096, 0, &target) == ZCT_OK);
        CHECK(zct_queue_set_wait(target, pol->poll, pol->spin_ns) == ZCT_OK);
        mapped m = map_queue(target);
        pthread_t t;
        int64_t r;
        CHECK(pthread_create(&t, NULL, take_status, &r) == 0);
        sleep_ms(50);
        CHECK(ftruncate(m.fd, 0) == 0); /* the hostile process */
        CHECK(pthread_join(t, NULL) == 0);
        CHECK(r == ZCT_E_CORRUPT);
        CHECK(take_plain(target, (uint8_t[64]){0}, 64, 10) == ZCT_E_CORRUPT);
        CHECK(unlink(m.path) == 0);
        unmap_queue(&m);
        (void)zct_queue_close(target); /* its counts lay in the file */

        stream st = make_stream(NULL, 4, 1);
        target = join(&st);
        CHECK(zct_stream_reader_set_wait(target, pol->poll, pol->spin_ns) == ZCT_OK);
        CHECK(pthread_create(&t, NULL, look_for_ever, &r) == 0);
        sleep_ms(50);
        char path[512];
        CHECK(truncate(shm_path(st.info.name, path, sizeof path), 0) == 0);
        CHECK(pthread_join(t, NULL) == 0);
        CHECK(r == ZCT_E_CORRUPT);
        CHECK(unlink(path) == 0);
        (void)zct_stream_reader_close(target);
        (void)zct_stream_close(st.s);
    }
}

/* A reader armed, and a thread asleep on its word in slices, when the file
   is cut: the sleep ends (the word cannot be read), the disarm and a new
   arm say the file faulted, and nothing kills the process. */
static volatile int shrunk;

static void *sleep_in_slices(void *arg) {
    sleeper *s = arg;
    uint32_t *word, seen;
    CHECK(zct_stream_reader_arm(s->r, &word, &seen) == ZCT_OK);
    do { /* a signal (the Go runtime's) ends a slice early: a slice like another */
        s->slept = zct_sleep(word, seen, 20);
    } while ((s->slept == ZCT_E_EMPTY || s->slept == ZCT_E_INTERRUPTED) && !__atomic_load_n(&shrunk, SEQ));
    if (s->slept == ZCT_E_EMPTY || s->slept == ZCT_E_INTERRUPTED) {
        do { /* one slice after the cut (again if a signal ended it) */
            s->slept = zct_sleep(word, seen, 20);
        } while (s->slept == ZCT_E_INTERRUPTED);
    }
    s->disarmed = zct_stream_reader_disarm(s->r);
    return NULL;
}

static void shrunk_under_arms(void) {
    stream st = make_stream(NULL, 4, 2);
    zct_handle r = join(&st);
    uint32_t *word, seen;
    CHECK(zct_stream_reader_arm(r, &word, &seen) == ZCT_OK);
    sleeper s = {r, 1, 1};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, sleep_in_slices, &s) == 0);
    while (sleepers(&st) < 2) {
        sleep_ms(1);
    }
    char path[512];
    CHECK(truncate(shm_path(st.info.name, path, sizeof path), 0) == 0);
    __atomic_store_n(&shrunk, 1, SEQ);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK(s.slept == ZCT_E_CLOSED); /* EFAULT: the word is past the file's end */
    CHECK(s.disarmed == ZCT_E_CORRUPT);
    CHECK(zct_stream_reader_disarm(r) == ZCT_E_CORRUPT);
    CHECK(zct_stream_reader_disarm(r) == ZCT_E_INVALID); /* both taken back from the handle */
    CHECK(zct_stream_reader_arm(r, &word, &seen) == ZCT_E_CORRUPT);
    CHECK(zct_stream_reader_disarm(r) == ZCT_E_INVALID);
    int32_t slot;
    CHECK(zct_stream_read_look(r, 10, &slot) == ZCT_E_CORRUPT);
    CHECK(unlink(path) == 0);
    (void)zct_stream_reader_close(r); /* its slot lay in the file */
    (void)zct_stream_close(st.s);
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "armed-child") == 0) {
        return armed_child(argv[2], atoi(argv[3]));
    }
    CHECK(argc == 2);
    alarm(600); /* a hang is a failure, not a stuck test */
    char self[4096], name[256];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    CHECK(n > 0);
    self[n] = 0;

    queue_timeouts();
    reader_timeouts();
    queue_switches();
    reader_switches();
    snprintf(name, sizeof name, "%s-close", argv[1]);
    close_under_pollers(name);
    many_queue_pollers(&polls[0]);
    many_queue_pollers(&polls[4]);
    many_reader_pollers(&polls[0]);
    many_reader_pollers(&polls[4]);

    arm_storm();
    arm_misuse();
    arms_past_the_table();
    close_under_arms();
    close_under_sleepers();
    snprintf(name, sizeof name, "%s-killed", argv[1]);
    killed_while_armed(self, name);

    /* Last: what a shrunk file leaves is not this program's to tidy. */
    shrunk_under_pollers();
    shrunk_under_arms();
    printf("ok\n");
    return 0;
}
