// The C contract of zctipc's queue calls at the limits of their arguments:
// counts of 0, -1 and INT32_MAX, record types that do not fit their byte,
// a timeout too long to add to the clock, inline records from C, and a
// queue closed while other threads are blocked in it. It prints "ok" when
// every check passes.
#define _DEFAULT_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "zctipc.h"
#include "check.h"

static zct_handle shared;

static void *put_later(void *arg) {
    (void)arg;
    usleep(100 * 1000);
    CHECK(zct_queue_put(shared, ZCT_RECORD_BYTES, "late", 4, NULL, 0, -1) == ZCT_OK);
    return NULL;
}

static void *blocked_get(void *arg) {
    char buf[64];
    int32_t type = 0, nviews = 0;
    uint64_t off = 0, len = 0;
    *(int *)arg = zct_queue_get(shared, buf, sizeof buf, -1, &type, &off, &len, NULL, 0, &nviews);
    return NULL;
}

static void *blocked_put(void *arg) {
    *(int *)arg = zct_queue_put(shared, ZCT_RECORD_BYTES, "x", 1, NULL, 0, -1);
    return NULL;
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    const char *name = argv[1];
    zct_handle q = 0;
    CHECK(zct_queue_create(NULL, 4096, 0, &q) == ZCT_OK);
    char buf[4096];
    int32_t type = 0, nviews = 0, written = -1;
    uint64_t off = 0, len = 0;
    int64_t items = -1, unfinished = -1;

    /* Counts out of range are named as counts, not as NULL pointers. */
    uint64_t ends[1] = {1};
    CHECK(zct_queue_put_many(q, ZCT_RECORD_BYTES, "x", ends, -1, 0, &written) == ZCT_E_INVALID);
    CHECK(strstr(zct_last_error(), "NULL") == NULL);
    CHECK(strstr(zct_last_error(), "count") != NULL);
    CHECK(zct_queue_get(q, buf, sizeof buf, 0, &type, &off, &len, NULL, -1, &nviews) == ZCT_E_INVALID);
    CHECK(strstr(zct_last_error(), "NULL") == NULL);
    CHECK(strstr(zct_last_error(), "views_cap") != NULL);
    CHECK(zct_queue_take(q, buf, sizeof buf, 0, NULL, -1, &nviews) == ZCT_E_INVALID);
    CHECK(strstr(zct_last_error(), "views_cap") != NULL);
    CHECK(zct_queue_put(q, ZCT_RECORD_BYTES, "x", 1, NULL, INT32_MAX, 0) == ZCT_E_INVALID);
    CHECK(strstr(zct_last_error(), "nviews") != NULL);

    /* Counts of 0 and INT32_MAX that are in range. */
    CHECK(zct_queue_put_many(q, ZCT_RECORD_BYTES, NULL, NULL, 0, 0, &written) == ZCT_OK && written == 0);
    CHECK(zct_queue_put(q, ZCT_RECORD_BYTES, NULL, 0, NULL, 0, 0) == ZCT_OK);
    int32_t records = 0;
    uint64_t filled = 0;
    zct_record recs[4];
    CHECK(zct_queue_get_many(q, buf, sizeof buf, 1, 0, &records, recs, &filled, NULL, INT32_MAX, &nviews) ==
          ZCT_E_INVALID);
    CHECK(strstr(zct_last_error(), "NULL") != NULL); /* views_cap > 0 needs views */
    CHECK(zct_queue_get_many(q, buf, sizeof buf, INT32_MAX, 0, &records, recs, &filled, NULL, 0, &nviews) ==
          ZCT_OK);
    CHECK(records == 1 && recs[0].payload_len == 0 && recs[0].type == ZCT_RECORD_BYTES);

    /* A record type is one byte: 256 + a type is not that type. */
    CHECK(zct_queue_put(q, 256 + ZCT_RECORD_BYTES, "x", 1, NULL, 0, 0) == ZCT_E_INVALID);
    CHECK(zct_queue_put(q, -256 + ZCT_RECORD_BYTES, "x", 1, NULL, 0, 0) == ZCT_E_INVALID);
    ends[0] = 1;
    CHECK(zct_queue_put_many(q, 256 + ZCT_RECORD_BYTES, "x", ends, 1, 0, &written) == ZCT_E_INVALID);
    CHECK(zct_queue_put(q, 0xFF, "12345678", 8, NULL, 0, 0) == ZCT_E_INVALID); /* a ring's skip marker */
    CHECK(zct_queue_len(q, &items, &unfinished) == ZCT_OK && items == 0);

    /* Inline records from C: a payload that is no inline array is refused,
       one in a batch refuses the batch, and an inline record holds no view. */
    CHECK(zct_queue_put(q, ZCT_RECORD_INLINE, "not an array", 12, NULL, 0, 0) == ZCT_E_INVALID);
    uint64_t two[2] = {0, 12};
    CHECK(zct_queue_put_many(q, ZCT_RECORD_INLINE, "not an array", two, 2, 0, &written) == ZCT_E_INVALID);
    CHECK(zct_queue_len(q, &items, &unfinished) == ZCT_OK && items == 0);
    int64_t shape[1] = {16}, strides[1] = {4};
    zct_handle seg = 0;
    zct_info info;
    CHECK(zct_segment_create(name, ZCT_FLOAT32, 1, shape, &seg, &info) == ZCT_OK);
    CHECK(zct_queue_put_array(q, ZCT_RECORD_INLINE, info.data, 64, ZCT_FLOAT32, 1, shape, strides, 0, 0) ==
          ZCT_E_INVALID);
    CHECK(zct_queue_put_array(q, 256 + ZCT_RECORD_TENSOR, info.data, 64, ZCT_FLOAT32, 1, shape, strides, 0, 0) ==
          ZCT_E_INVALID);
    int64_t count = 0;
    CHECK(zct_segment_refcount(seg, &count) == ZCT_OK && count == 1);
    CHECK(zct_queue_len(q, &items, &unfinished) == ZCT_OK && items == 0);
    CHECK(zct_segment_close(seg) == ZCT_OK);

    /* A timeout too long to add to the clock waits, as for ever does. */
    shared = q;
    pthread_t later;
    CHECK(pthread_create(&later, NULL, put_later, NULL) == 0);
    CHECK(zct_queue_get(q, buf, sizeof buf, INT64_MAX, &type, &off, &len, NULL, 0, &nviews) == ZCT_OK);
    CHECK(len == 4 && memcmp(buf + off, "late", 4) == 0);
    CHECK(pthread_join(later, NULL) == 0);
    CHECK(zct_queue_close(q) == ZCT_OK);

    /* Close while threads are blocked in get (an empty queue) and in put
       (a full one): each returns ZCT_E_CLOSED, the queue is gone, a second
       close and later calls are ZCT_E_CLOSED, and the library is not
       poisoned. */
    for (int full = 0; full < 2; full++) {
        CHECK(zct_queue_create(name, 4096, 1, &shared) == ZCT_OK);
        if (full) CHECK(zct_queue_put(shared, ZCT_RECORD_BYTES, "x", 1, NULL, 0, 0) == ZCT_OK);
        enum { N = 8 };
        pthread_t threads[N];
        int status[N];
        for (int i = 0; i < N; i++) {
            status[i] = 1;
            CHECK(pthread_create(&threads[i], NULL, full ? blocked_put : blocked_get, &status[i]) == 0);
        }
        usleep(50 * 1000); /* let them block (not asserted: any order passes) */
        CHECK(zct_queue_close(shared) == ZCT_OK);
        for (int i = 0; i < N; i++) {
            CHECK(pthread_join(threads[i], NULL) == 0);
            CHECK(status[i] == ZCT_E_CLOSED);
        }
        CHECK(zct_queue_close(shared) == ZCT_E_CLOSED);
        CHECK(zct_queue_len(shared, &items, &unfinished) == ZCT_E_CLOSED);
        CHECK(zct_queue_put(shared, ZCT_RECORD_BYTES, "x", 1, NULL, 0, 0) == ZCT_E_CLOSED);
        zct_handle again = 0;
        CHECK(zct_queue_attach(name, 0, &again) == ZCT_E_NOT_FOUND);
    }
    CHECK(zct_queue_create(NULL, 4096, 0, &q) == ZCT_OK);
    CHECK(zct_queue_close(q) == ZCT_OK);
    /* A normal exit gives up what the process still holds, as zctipc.h
       says a C program does: the ticket arena of the counts it sent. */
    CHECK(zct_release_all(NULL) == ZCT_OK);
    printf("ok\n");
    return 0;
}
