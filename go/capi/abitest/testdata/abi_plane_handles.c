// The handles of the C ABI's queue calls that run without Go (fast.c: a
// table of queues in C, filled by Go at open and emptied before close):
// zero, UINT64_MAX, forged, closed, and other kinds' handles are refused
// as closed; a handle closed while threads put, take, arm and disarm on it
// is never used after (each call either runs or says ZCT_E_CLOSED) and the
// sleeps armed through it are taken back exactly, while those another
// handle of the queue armed stay; arm and disarm out of balance, or on
// another handle, or of a word out of range, are refused; thousands of
// queues open at once (past the table's 1024 slots) work alike, through Go.
// It prints "ok" when every check passes.
#define _GNU_SOURCE
#include <pthread.h>
#include "mapped.h"

/* Every fast call on h says ZCT_E_CLOSED. */
static void refused(zct_handle h) {
    uint8_t buf[64];
    uint32_t *word = NULL, seen = 0;
    int32_t nviews = -1;
    CHECK(zct_queue_put(h, ZCT_RECORD_BYTES, "x", 1, NULL, 0, 0) == ZCT_E_CLOSED);
    CHECK(zct_queue_put(h, ZCT_RECORD_PICKLE, NULL, 0, NULL, 0, -1) == ZCT_E_CLOSED);
    CHECK(zct_queue_take(h, buf, sizeof buf, 0, NULL, 0, &nviews) == ZCT_E_CLOSED);
    CHECK(zct_queue_take(h, buf, sizeof buf, -1, NULL, 0, &nviews) == ZCT_E_CLOSED);
    for (int which = 0; which < 3; which++) {
        CHECK(zct_queue_arm(h, which, &word, &seen) == ZCT_E_CLOSED);
        CHECK(zct_queue_disarm(h, which, 0) == ZCT_E_CLOSED);
        CHECK(zct_queue_disarm(h, which, 1) == ZCT_E_CLOSED);
    }
}

static void foreign_handles(void) {
    refused(0);
    refused(UINT64_MAX);
    refused(UINT64_MAX - 1);
    refused((zct_handle)1 << 63);
    zct_handle q, e;
    CHECK(zct_queue_create(NULL, 4096, 0, &q) == ZCT_OK);
    for (zct_handle d = 1; d < 64; d++) {
        refused(q + d); /* handles not yet given */
        refused(q ^ (d << 40));
    }
    char name[256];
    CHECK(zct_event_create(NULL, &e, name, sizeof name) == ZCT_OK);
    refused(e); /* another kind's */
    zct_handle ref;
    void *mem;
    uint64_t size;
    CHECK(zct_pool_alloc(64, 0, &ref, &mem, &size) == ZCT_OK);
    refused(ref);
    CHECK(zct_ref_release(ref) == ZCT_OK);
    refused(ref);
    CHECK(zct_event_close(e) == ZCT_OK);
    refused(e);
    CHECK(zct_queue_close(q) == ZCT_OK);
    refused(q); /* stale */
    CHECK(zct_queue_close(q) == ZCT_E_CLOSED);
    CHECK(zct_pool_trim() == ZCT_OK);
}

/* Arms and disarms out of balance, of words out of range, and across
   handles of one queue: the waiter counts in shared memory are always
   those of the arms not taken back. */
static void arms(const char *name) {
    zct_handle a, b;
    CHECK(zct_queue_create(name, 4096, 0, &a) == ZCT_OK);
    CHECK(zct_queue_attach(name, 0, &b) == ZCT_OK);
    mapped m = map_queue(a);
    const int waiters[3] = {DATA_WAITERS, SPACE_WAITERS, JOIN_WAITERS};
    uint32_t *word = NULL, seen = 0;
    for (int w = 0; w < 3; w++) {
        CHECK(zct_queue_disarm(a, w, 0) == ZCT_E_INVALID); /* never armed */
        CHECK(zct_queue_arm(a, w, &word, &seen) == ZCT_OK);
        CHECK(zct_queue_arm(a, w, &word, &seen) == ZCT_OK);
        CHECK(ld32(&m, waiters[w]) == 2);
        CHECK(zct_queue_disarm(b, w, 1) == ZCT_E_INVALID); /* armed on a, not b */
        CHECK(ld32(&m, waiters[w]) == 2);
        CHECK(zct_queue_disarm(a, w, 1) == ZCT_OK);
        CHECK(ld32(&m, waiters[w]) == 1);
        CHECK(zct_queue_arm(b, w, &word, &seen) == ZCT_OK);
        CHECK(ld32(&m, waiters[w]) == 2);
    }
    int32_t bad[] = {-1, 3, 4, INT32_MAX, INT32_MIN};
    for (int i = 0; i < 5; i++) {
        CHECK(zct_queue_arm(a, bad[i], &word, &seen) == ZCT_E_INVALID);
        CHECK(zct_queue_disarm(a, bad[i], 0) == ZCT_E_INVALID);
    }
    CHECK(zct_queue_arm(a, 0, NULL, &seen) == ZCT_E_INVALID);
    CHECK(zct_queue_arm(a, 0, &word, NULL) == ZCT_E_INVALID);
    for (int w = 0; w < 3; w++) {
        CHECK(ld32(&m, waiters[w]) == 2);
    }
    CHECK(zct_queue_close(a) == ZCT_OK); /* takes back its one arm of each */
    for (int w = 0; w < 3; w++) {
        CHECK(ld32(&m, waiters[w]) == 1);
        CHECK(zct_queue_disarm(a, w, 0) == ZCT_E_CLOSED);
        CHECK(ld32(&m, waiters[w]) == 1);
        CHECK(zct_queue_disarm(b, w, 0) == ZCT_OK);
        CHECK(ld32(&m, waiters[w]) == 0);
        CHECK(zct_queue_disarm(b, w, 0) == ZCT_E_INVALID);
    }
    unmap_queue(&m);
    CHECK(zct_queue_close(b) == ZCT_OK);
}

/* Threads at work on a handle that another closes. */
static zct_handle target;
static volatile int go;

static void *hammer(void *arg) {
    long id = (long)arg;
    uint8_t buf[256];
    uint32_t *word, seen;
    while (!go) {
    }
    for (unsigned i = 0;; i++) {
        int w = (int)((id + i) % 3), r;
        switch ((id + i) % 5) {
        case 0:
            r = zct_queue_put(target, ZCT_RECORD_BYTES, buf, 1 + i % 200, NULL, 0, 0);
            CHECK(r == ZCT_OK || r == ZCT_E_FULL || r == ZCT_E_CLOSED);
            break;
        case 1:
            r = (int)take_plain(target, buf, sizeof buf, 0);
            CHECK(r >= 0 || r == ZCT_E_EMPTY || r == ZCT_E_CLOSED);
            break;
        case 2:
        case 3:
            r = zct_queue_arm(target, w, &word, &seen);
            CHECK(r == ZCT_OK || r == ZCT_E_CLOSED);
            break;
        default:
            r = zct_queue_disarm(target, w, (int)(i & 1));
            /* Another thread's arm is this one's to take back: a handle's
               arms are counted, not owned. */
            CHECK(r == ZCT_OK || r == ZCT_E_INVALID || r == ZCT_E_CLOSED);
        }
        if (r == ZCT_E_CLOSED) {
            return NULL;
        }
    }
}

static void close_under_calls(const char *name) {
    zct_handle other;
    CHECK(zct_queue_create(name, 4096, 0, &other) == ZCT_OK);
    mapped m = map_queue(other);
    uint32_t *word, seen;
    CHECK(zct_queue_arm(other, ZCT_WAIT_DATA, &word, &seen) == ZCT_OK);
    CHECK(zct_queue_arm(other, ZCT_WAIT_SPACE, &word, &seen) == ZCT_OK);
    CHECK(zct_queue_arm(other, ZCT_WAIT_SPACE, &word, &seen) == ZCT_OK);
    for (int round = 0; round < 200; round++) {
        CHECK(zct_queue_attach(name, 0, &target) == ZCT_OK);
        go = 0;
        pthread_t t[4];
        for (long i = 0; i < 4; i++) {
            CHECK(pthread_create(&t[i], NULL, hammer, (void *)i) == 0);
        }
        go = 1;
        struct timespec ts = {0, (round % 20) * 50 * 1000};
        nanosleep(&ts, NULL);
        CHECK(zct_queue_close(target) == ZCT_OK);
        for (int i = 0; i < 4; i++) {
            CHECK(pthread_join(t[i], NULL) == 0);
        }
        refused(target);
        /* What the closed handle armed went with it; other's arms stay. */
        CHECK(ld32(&m, DATA_WAITERS) == 1);
        CHECK(ld32(&m, SPACE_WAITERS) == 2);
        CHECK(ld32(&m, JOIN_WAITERS) == 0);
        CHECK(ld32(&m, PUT_LOCK) == 0 && ld32(&m, GET_LOCK) == 0);
    }
    unmap_queue(&m);
    CHECK(zct_queue_close(other) == ZCT_OK);
}

/* More queues open at once than the table has slots: those past it go
   through Go, and every call works alike on every one. */
static void many_queues(void) {
    enum { N = 3000 };
    static zct_handle qs[N];
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < N; i++) {
            CHECK(zct_queue_create(NULL, 4096, 1, &qs[i]) == ZCT_OK);
        }
        for (int i = 0; i < N; i++) {
            uint8_t buf[64];
            uint32_t *word, seen;
            uint32_t v = (uint32_t)i;
            CHECK(zct_queue_put(qs[i], ZCT_RECORD_BYTES, &v, 4, NULL, 0, 0) == ZCT_OK);
            CHECK(zct_queue_put(qs[i], ZCT_RECORD_BYTES, &v, 4, NULL, 0, 0) == ZCT_E_FULL);
            CHECK(zct_queue_arm(qs[i], ZCT_WAIT_SPACE, &word, &seen) == ZCT_OK);
            CHECK(zct_queue_arm(qs[i], ZCT_WAIT_DATA, &word, &seen) == ZCT_OK);
            CHECK(zct_queue_disarm(qs[i], ZCT_WAIT_DATA, 1) == ZCT_OK);
            CHECK(zct_queue_disarm(qs[i], ZCT_WAIT_DATA, 1) == ZCT_E_INVALID);
            CHECK(take_plain(qs[i], buf, sizeof buf, 0) == 4);
            memcpy(&v, buf + ZCT_RECORD_HEADER, 4);
            CHECK(v == (uint32_t)i);
            CHECK(take_plain(qs[i], buf, sizeof buf, 0) == ZCT_E_EMPTY);
        }
        for (int i = 0; i < N; i++) {
            zct_handle other = 0;
            if (i % 7 == round) { /* another handle keeps the file, to look at */
                char name[256];
                uint64_t capacity, maxsize;
                CHECK(zct_queue_describe(qs[i], name, sizeof name, &capacity, &maxsize) == ZCT_OK);
                CHECK(zct_queue_attach(name, 0, &other) == ZCT_OK);
            }
            CHECK(zct_queue_close(qs[i]) == ZCT_OK);
            refused(qs[i]);
            if (other != 0) {
                mapped m = map_queue(other);
                CHECK(ld32(&m, SPACE_WAITERS) == 0 && ld32(&m, DATA_WAITERS) == 0); /* the close took its arm back */
                unmap_queue(&m);
                CHECK(zct_queue_close(other) == ZCT_OK);
            }
        }
    }
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    char name[256];
    foreign_handles();
    snprintf(name, sizeof name, "%s-arms", argv[1]);
    arms(name);
    snprintf(name, sizeof name, "%s-close", argv[1]);
    close_under_calls(name);
    many_queues();
    printf("ok\n");
    return 0;
}
