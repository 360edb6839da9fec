// Inline arrays through the data plane from C, at its edges: records of
// every size put by zct_queue_put_inline laps around a 4096-byte ring,
// across its end, and each one taken by the plane (zct_queue_take) gives
// the view Go's get (zct_queue_get) gives of its twin; a take with a
// negative views_cap or no views takes nothing; a full queue answers
// ZCT_E_FULL at once. It prints "ok" when every check passes.
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "zctipc.h"
#include "check.h"

int main(void) {
    zct_handle q = 0;
    CHECK(zct_queue_create(NULL, 4096, 0, &q) == ZCT_OK);
    static char a[4096], b[4096];
    zct_view va[2], vb[2];
    int32_t na = -1, nb = -1, type = 0;
    uint64_t off = 0, plen = 0;
    int16_t data[300];
    for (int i = 0; i < 300; i++) {
        data[i] = (int16_t)(i * 7 - 1000);
    }
    for (int lap = 0; lap < 2000; lap++) {
        int64_t n = lap % 300, shape[2] = {n, 1};
        int32_t ndim = 1 + lap % 2;
        for (int k = 0; k < 2; k++) {
            CHECK(zct_queue_put_inline(q, n ? data : NULL, (uint64_t)n * 2, ZCT_INT16, ndim, shape, lap % 8, 0) == ZCT_OK);
        }
        int64_t r = zct_queue_take(q, a, sizeof a, 0, va, 2, &na);
        CHECK(r >= 0 && na == 1);
        CHECK(zct_queue_get(q, b, sizeof b, 0, &type, &off, &plen, vb, 2, &nb) == ZCT_OK && nb == 1);
        CHECK((uint64_t)r == (plen | off << ZCT_TAKE_OFFSET_SHIFT | (uint64_t)type << ZCT_TAKE_TYPE_SHIFT));
        CHECK(va[0].offset == vb[0].offset && va[0].nbytes == vb[0].nbytes && va[0].nbytes == (uint64_t)n * 2);
        CHECK(va[0].dtype == vb[0].dtype && va[0].ndim == vb[0].ndim && va[0].ndim == ndim);
        CHECK(va[0].kind == vb[0].kind && va[0].flags == vb[0].flags && va[0].flags == lap % 8 && va[0].ref == 0);
        for (int d = 0; d < ndim; d++) {
            CHECK(va[0].shape[d] == vb[0].shape[d] && va[0].strides[d] == vb[0].strides[d]);
        }
        CHECK(va[0].data == a + va[0].offset && vb[0].data == b + vb[0].offset);
        CHECK(memcmp(va[0].data, data, va[0].nbytes) == 0 && memcmp(vb[0].data, data, vb[0].nbytes) == 0);
    }

    /* Takes that may write no view take nothing. */
    int64_t one = 1;
    CHECK(zct_queue_put_inline(q, data, 2, ZCT_INT16, 1, &one, 0, 0) == ZCT_OK);
    CHECK(zct_queue_take(q, a, sizeof a, 0, va, -1, &na) == ZCT_E_INVALID);
    CHECK(zct_queue_take(q, a, sizeof a, 0, NULL, 1, &na) == ZCT_E_INVALID);
    CHECK(zct_queue_take(q, a, sizeof a, 0, va, 0, &na) == ZCT_E_RANGE);
    CHECK(zct_queue_take(q, a, sizeof a, 0, va, 1, &na) >= 0 && na == 1);
    CHECK(zct_queue_take(q, a, sizeof a, 0, va, 1, &na) == ZCT_E_EMPTY);

    /* A full ring: no room, no wait. */
    int64_t big = 1000;
    int put = 0;
    while (zct_queue_put_inline(q, data, 2000, ZCT_INT16, 1, &big, 0, 0) == ZCT_OK) {
        put++;
    }
    CHECK(put == 2); /* 2032-byte records in a 4096-byte ring */
    CHECK(zct_queue_put_inline(q, data, 2000, ZCT_INT16, 1, &big, 0, 0) == ZCT_E_FULL);
    for (int i = 0; i < put; i++) {
        CHECK(zct_queue_take(q, a, sizeof a, 0, va, 1, &na) >= 0 && va[0].nbytes == 2000);
    }
    CHECK(zct_queue_close(q) == ZCT_OK);
    printf("ok\n");
    return 0;
}
