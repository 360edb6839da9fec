// Attacks on the hand-over through the C ABI: records that a writer who
// lies puts in the ring (inline headers that say what their bytes are
// not, a descriptor replayed, a header claiming every descriptor), a run
// of records with bad ones among good ones (each good one is given whole,
// with its views; each bad one has type 0 and none), room for zero and one
// view, and zct_queue_peek of the forged records. It prints "ok" when
// every check passes, and leaves no count taken.
#define _GNU_SOURCE
#include "mapped.h"

static mapped m; /* the queue's file */
static zct_handle queue;

static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

/* An inline record of n uint8 elements (all 7) whose header says shape
   dims of ndim (which may lie), flags, and ndesc descriptors; its size. */
static uint32_t inline_record(uint8_t *raw, uint16_t ndesc, uint8_t flags, int ndim, const int64_t *dims, int n) {
    uint32_t plen = 8 + 8 * ndim + n, size = (ZCT_RECORD_HEADER + plen + 7) & ~7u;
    memset(raw, 0, size);
    put32(raw, size);
    raw[4] = ZCT_RECORD_INLINE;
    put16(raw + 6, ndesc);
    put32(raw + 8, plen);
    uint8_t *p = raw + ZCT_RECORD_HEADER;
    put16(p, ZCT_UINT8);
    p[2] = flags;
    p[3] = (uint8_t)ndim;
    for (int i = 0; i < ndim; i++) put64(p + 8 + 8 * i, (uint64_t)dims[i]);
    memset(p + 8 + 8 * ndim, 7, n);
    return size;
}

/* Put a tensor record of a fresh pool slot of four float32s from first. */
static void put_tensor(float first) {
    zct_view v = slot_view(first, 16);
    CHECK(zct_queue_put(queue, ZCT_RECORD_TENSOR, NULL, 0, &v, 1, 0) == ZCT_OK);
}

int main(void) {
    static char buf[1 << 16];
    static zct_view views[8];
    zct_record recs[16];
    int32_t type = 0, nviews = -1, records = -1;
    uint64_t off = 0, plen = 0, filled = 0;
    uint8_t raw[512];
    int64_t dims[2] = {100, 0};

    CHECK(zct_queue_create(NULL, 1 << 16, 0, &queue) == ZCT_OK);
    m = map_queue(queue);

    /* A get_many that fails before it takes a record says it took none. */
    records = 99;
    CHECK(zct_queue_get_many(queue, buf, sizeof buf, 4, 0, &records, recs, &filled, views, 8, &nviews) ==
          ZCT_E_EMPTY);
    CHECK(records == 0);

    /* A descriptor to replay: a tensor record's bytes, once taken. */
    put_tensor(100);
    CHECK(zct_queue_get(queue, buf, sizeof buf, 0, &type, &off, &plen, views, 8, &nviews) == ZCT_OK);
    CHECK(type == ZCT_RECORD_TENSOR && nviews == 1 && views[0].ref != 0);
    zct_handle first = views[0].ref;
    uint32_t replay_size;
    memcpy(&replay_size, buf, 4);
    uint8_t replay[512];
    CHECK(replay_size <= sizeof replay);
    memcpy(replay, buf, replay_size);

    /* A run: inline, tensor, a lying inline (its array runs past it), the
       replay, bytes, inline. */
    int64_t two[1] = {2};
    CHECK(zct_queue_put_inline(queue, "ab", 2, ZCT_UINT8, 1, two, 0, 0) == ZCT_OK);
    put_tensor(1);
    forge(&m, queue, raw, inline_record(raw, 0, 0, 1, dims, 8));
    forge(&m, queue, replay, replay_size);
    CHECK(zct_queue_put(queue, ZCT_RECORD_BYTES, "end", 3, NULL, 0, 0) == ZCT_OK);
    CHECK(zct_queue_put_inline(queue, "cd", 2, ZCT_UINT8, 1, two, 0, 0) == ZCT_OK);
    int status = zct_queue_get_many(queue, buf, sizeof buf, 16, 0, &records, recs, &filled, views, 8, &nviews);
    CHECK(status == ZCT_E_CORRUPT);
    CHECK(strstr(zct_last_error(), "already taken") != NULL);
    CHECK(records == 6 && nviews == 3);
    CHECK(recs[0].type == ZCT_RECORD_INLINE && recs[0].nviews == 1);
    CHECK(views[0].ref == 0 && views[0].kind == ZCT_REF_INLINE && memcmp(buf + views[0].offset, "ab", 2) == 0);
    CHECK(recs[1].type == ZCT_RECORD_TENSOR && recs[1].nviews == 1);
    CHECK(views[1].ref != 0 && ((float *)views[1].data)[3] == 4);
    CHECK(recs[2].type == 0 && recs[2].nviews == 0 && recs[2].payload_len == 0);
    CHECK(recs[3].type == 0 && recs[3].nviews == 0 && recs[3].payload_len == 0);
    CHECK(recs[4].type == ZCT_RECORD_BYTES && recs[4].nviews == 0);
    CHECK(recs[4].payload_len == 3 && memcmp(buf + recs[4].payload_offset, "end", 3) == 0);
    CHECK(recs[5].type == ZCT_RECORD_INLINE && recs[5].nviews == 1);
    CHECK(views[2].ref == 0 && memcmp(buf + views[2].offset, "cd", 2) == 0);
    CHECK(zct_ref_release(views[1].ref) == ZCT_OK);
    int64_t holders = 0;
    CHECK(zct_ref_holders(first, &holders) == ZCT_OK && holders == 1);
    CHECK(zct_ref_release(first) == ZCT_OK);
    CHECK(slots_in_use() == 0);

    /* Room for no view, then one: an inline record needs one, and a
       tensor record beside it one more. */
    CHECK(zct_queue_put_inline(queue, "ab", 2, ZCT_UINT8, 1, two, 0, 0) == ZCT_OK);
    put_tensor(5);
    CHECK(zct_queue_get_many(queue, buf, sizeof buf, 16, 0, &records, recs, &filled, NULL, 0, &nviews) ==
          ZCT_E_RANGE);
    CHECK(nviews == 1);
    CHECK(zct_queue_get_many(queue, buf, sizeof buf, 16, 0, &records, recs, &filled, views, 1, &nviews) == ZCT_OK);
    CHECK(records == 1 && nviews == 1 && views[0].ref == 0);
    CHECK(zct_queue_take(queue, buf, sizeof buf, 0, NULL, 0, &nviews) == ZCT_E_RANGE);
    int64_t r = zct_queue_take(queue, buf, sizeof buf, 0, views, 1, &nviews);
    CHECK(r >= 0 && r >> ZCT_TAKE_TYPE_SHIFT == ZCT_RECORD_TENSOR && nviews == 1);
    CHECK(zct_ref_release(views[0].ref) == ZCT_OK);
    CHECK(slots_in_use() == 0);

    /* An inline record claiming every descriptor asks for one view more
       than any record has; given that room, it is taken and refused. */
    forge(&m, queue, raw, inline_record(raw, 0xFFFF, 0, 0, NULL, 1));
    static zct_view many[0x10000];
    CHECK(zct_queue_get(queue, buf, sizeof buf, 0, &type, &off, &plen, many, 0xFFFF, &nviews) == ZCT_E_RANGE);
    CHECK(nviews == 0x10000);
    CHECK(zct_queue_get(queue, buf, sizeof buf, 0, &type, &off, &plen, many, 0x10000, &nviews) == ZCT_E_CORRUPT);

    /* Peek of forged inline records: each lie fails with the cursor past
       it; the arrays at the edges (no element, no dimension) are views. */
    int64_t huge[2] = {0, INT64_C(1) << 62}, past[2] = {INT64_C(1) << 32, INT64_C(1) << 32};
    forge(&m, queue, raw, inline_record(raw, 0, 0x80, 1, two, 2)); /* flags past 7 */
    forge(&m, queue, raw, inline_record(raw, 0, 0, 2, past, 0));   /* a shape past 2^63 bytes */
    forge(&m, queue, raw, inline_record(raw, 0, 0, 2, huge, 0));   /* no element, one dimension of 2^62 */
    forge(&m, queue, raw, inline_record(raw, 0, 0, 0, NULL, 1));   /* a scalar */
    uint64_t cursor = ZCT_PEEK_OLDEST, missed = 0;
    CHECK(zct_queue_peek(queue, &cursor, buf, sizeof buf, &type, &off, &plen, views, 8, &nviews, &missed) ==
          ZCT_E_CORRUPT);
    CHECK(zct_queue_peek(queue, &cursor, buf, sizeof buf, &type, &off, &plen, views, 8, &nviews, &missed) ==
          ZCT_E_CORRUPT);
    CHECK(zct_queue_peek(queue, &cursor, buf, sizeof buf, &type, &off, &plen, views, 8, &nviews, &missed) == ZCT_OK);
    CHECK(type == ZCT_RECORD_INLINE && nviews == 1 && views[0].ref == 0 && views[0].nbytes == 0);
    CHECK(views[0].ndim == 2 && views[0].shape[1] == INT64_C(1) << 62 && views[0].strides[0] == INT64_C(1) << 62);
    CHECK(zct_queue_peek(queue, &cursor, buf, sizeof buf, &type, &off, &plen, views, 0, &nviews, &missed) ==
          ZCT_E_RANGE);
    CHECK(nviews == 1);
    CHECK(zct_queue_peek(queue, &cursor, buf, sizeof buf, &type, &off, &plen, views, 1, &nviews, &missed) == ZCT_OK);
    CHECK(type == ZCT_RECORD_INLINE && views[0].ndim == 0 && views[0].nbytes == 1);
    CHECK(((uint8_t *)buf)[views[0].offset] == 7);
    CHECK(zct_queue_peek(queue, &cursor, buf, sizeof buf, &type, &off, &plen, views, 8, &nviews, &missed) ==
          ZCT_E_EMPTY);
    /* and a get takes them as the peek read them */
    for (int i = 0; i < 2; i++)
        CHECK(zct_queue_get(queue, buf, sizeof buf, 0, &type, &off, &plen, views, 8, &nviews) == ZCT_E_CORRUPT);
    CHECK(zct_queue_get(queue, buf, sizeof buf, 0, &type, &off, &plen, views, 8, &nviews) == ZCT_OK);
    CHECK(zct_queue_get(queue, buf, sizeof buf, 0, &type, &off, &plen, views, 8, &nviews) == ZCT_OK);
    CHECK(type == ZCT_RECORD_INLINE && views[0].ndim == 0);

    unmap_queue(&m);
    CHECK(zct_queue_close(queue) == ZCT_OK);
    CHECK(slots_in_use() == 0);
    CHECK(zct_release_all(NULL) == ZCT_OK);
    printf("ok\n");
    return 0;
}
