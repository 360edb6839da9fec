// zct_queue_put_inline from C: the library builds an inline record in one
// call, a get gives its array back as one view in the get's buffer (which
// holds no ref), the result of zct_queue_take unpacks with zctipc.h's
// ZCT_TAKE_* constants, and each bad argument is refused with its status
// and a message that names it, putting nothing. It prints "ok" when every
// check passes.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "zctipc.h"
#include "check.h"

static int64_t items(zct_handle q) {
    int64_t n = -1, unfinished = -1;
    CHECK(zct_queue_len(q, &n, &unfinished) == ZCT_OK);
    return n;
}

int main(void) {
    zct_handle q = 0;
    CHECK(zct_queue_create(NULL, 4096, 0, &q) == ZCT_OK);
    float data[6] = {0, 1, 2, 3, 4, 5};
    int64_t shape[2] = {2, 3};
    char buf[4096];
    zct_view views[2];
    int32_t nviews = -1;

    /* Put, then take: the record type, the payload where the header says,
       and the array as one view of its elements in buf. */
    CHECK(zct_queue_put_inline(q, data, sizeof data, ZCT_FLOAT32, 2, shape, ZCT_VIEW_READONLY, 0) == ZCT_OK);
    int64_t r = zct_queue_take(q, buf, sizeof buf, 0, views, 2, &nviews);
    CHECK(r >= 0);
    uint64_t len = (uint64_t)r & ZCT_TAKE_FIELD_MASK;
    uint64_t off = ((uint64_t)r >> ZCT_TAKE_OFFSET_SHIFT) & ZCT_TAKE_FIELD_MASK;
    CHECK(r >> ZCT_TAKE_TYPE_SHIFT == ZCT_RECORD_INLINE);
    CHECK(off == ZCT_RECORD_HEADER && len == 8 + 2 * 8 + sizeof data);
    CHECK(nviews == 1);
    CHECK(views[0].ref == 0 && views[0].kind == ZCT_REF_INLINE);
    CHECK(views[0].dtype == ZCT_FLOAT32 && views[0].flags == ZCT_VIEW_READONLY && views[0].ndim == 2);
    CHECK(views[0].shape[0] == 2 && views[0].shape[1] == 3 && views[0].strides[0] == 12 && views[0].strides[1] == 4);
    CHECK(views[0].nbytes == sizeof data && views[0].offset == off + len - sizeof data);
    CHECK(views[0].data == buf + views[0].offset && memcmp(views[0].data, data, sizeof data) == 0);

    /* A get with no room for views leaves it: it needs one. */
    CHECK(zct_queue_put_inline(q, data, sizeof data, ZCT_FLOAT32, 2, shape, 0, 0) == ZCT_OK);
    int32_t type = 0;
    uint64_t plen = 0;
    CHECK(zct_queue_get(q, buf, sizeof buf, 0, &type, &off, &plen, NULL, 0, &nviews) == ZCT_E_RANGE);
    CHECK(nviews == 1);
    CHECK(zct_queue_get(q, buf, sizeof buf, 0, &type, &off, &plen, views, 1, &nviews) == ZCT_OK);
    CHECK(type == ZCT_RECORD_INLINE && nviews == 1 && views[0].ref == 0);

    /* Several at once: each inline record's view follows the views before
       it; an empty array and a scalar go too. */
    int64_t none[1] = {0};
    CHECK(zct_queue_put_inline(q, NULL, 0, ZCT_FLOAT32, 1, none, 0, 0) == ZCT_OK);
    CHECK(zct_queue_put(q, ZCT_RECORD_BYTES, "x", 1, NULL, 0, 0) == ZCT_OK);
    double scalar = 2.5;
    CHECK(zct_queue_put_inline(q, &scalar, sizeof scalar, ZCT_FLOAT64, 0, NULL, 0, 0) == ZCT_OK);
    int32_t records = 0;
    uint64_t filled = 0;
    zct_record recs[4];
    CHECK(zct_queue_get_many(q, buf, sizeof buf, 4, 0, &records, recs, &filled, views, 2, &nviews) == ZCT_OK);
    CHECK(records == 3 && nviews == 2);
    CHECK(recs[0].type == ZCT_RECORD_INLINE && recs[0].nviews == 1 && views[0].nbytes == 0 && views[0].ndim == 1);
    CHECK(recs[1].type == ZCT_RECORD_BYTES && recs[1].nviews == 0);
    CHECK(recs[2].type == ZCT_RECORD_INLINE && recs[2].nviews == 1 && views[1].ndim == 0);
    CHECK(views[1].nbytes == 8 && memcmp(buf + views[1].offset, &scalar, 8) == 0);

    /* Bad arguments, each with its status, and nothing put. */
    CHECK(zct_queue_put_inline(q, data, sizeof data, ZCT_FLOAT32, -1, shape, 0, 0) == ZCT_E_INVALID);
    CHECK(strstr(zct_last_error(), "ndim") != NULL && strstr(zct_last_error(), "NULL") == NULL);
    CHECK(zct_queue_put_inline(q, data, sizeof data, ZCT_FLOAT32, ZCT_MAX_NDIM + 1, shape, 0, 0) == ZCT_E_INVALID);
    CHECK(strstr(zct_last_error(), "ndim") != NULL);
    CHECK(zct_queue_put_inline(q, data, sizeof data - 4, ZCT_FLOAT32, 2, shape, 0, 0) == ZCT_E_INVALID);
    CHECK(strstr(zct_last_error(), "24 bytes, not 20") != NULL);
    int64_t negative[1] = {-1};
    CHECK(zct_queue_put_inline(q, data, 0, ZCT_FLOAT32, 1, negative, 0, 0) == ZCT_E_INVALID);
    CHECK(zct_queue_put_inline(q, data, sizeof data, 99, 2, shape, 0, 0) == ZCT_E_DTYPE);
    CHECK(zct_queue_put_inline(q, data, sizeof data, ZCT_FLOAT32, 2, shape, 8, 0) == ZCT_E_INVALID);
    CHECK(strstr(zct_last_error(), "flags") != NULL);
    CHECK(zct_queue_put_inline(q, NULL, sizeof data, ZCT_FLOAT32, 2, shape, 0, 0) == ZCT_E_INVALID);
    CHECK(strstr(zct_last_error(), "NULL") != NULL);
    CHECK(zct_queue_put_inline(q, data, sizeof data, ZCT_FLOAT32, 2, NULL, 0, 0) == ZCT_E_INVALID);
    CHECK(strstr(zct_last_error(), "NULL") != NULL);
    /* A record larger than the ring takes, and one larger than any does
       (its bytes are never read). */
    static char big[4096];
    int64_t big_shape[1] = {sizeof big};
    CHECK(zct_queue_put_inline(q, big, sizeof big, ZCT_UINT8, 1, big_shape, 0, 0) == ZCT_E_INVALID);
    CHECK(strstr(zct_last_error(), "larger than the queue") != NULL);
    int64_t huge_shape[1] = {INT64_C(1) << 40};
    CHECK(zct_queue_put_inline(q, big, UINT64_C(1) << 40, ZCT_UINT8, 1, huge_shape, 0, 0) == ZCT_E_INVALID);
    CHECK(strstr(zct_last_error(), "larger than the queue") != NULL);
    CHECK(items(q) == 0);
    CHECK(zct_queue_close(q) == ZCT_OK);

    /* A full queue: ZCT_E_FULL at the timeout; a closed one: ZCT_E_CLOSED. */
    CHECK(zct_queue_create(NULL, 4096, 1, &q) == ZCT_OK);
    CHECK(zct_queue_put_inline(q, data, sizeof data, ZCT_FLOAT32, 2, shape, 0, 0) == ZCT_OK);
    CHECK(zct_queue_put_inline(q, data, sizeof data, ZCT_FLOAT32, 2, shape, 0, 10) == ZCT_E_FULL);
    CHECK(zct_queue_close(q) == ZCT_OK);
    CHECK(zct_queue_put_inline(q, data, sizeof data, ZCT_FLOAT32, 2, shape, 0, 0) == ZCT_E_CLOSED);
    CHECK(zct_release_all(NULL) == ZCT_OK);
    printf("ok\n");
    return 0;
}
