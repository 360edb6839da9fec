// The C contract of zctipc's queue and count functions: NULL out-parameters,
// bad counts and short extents are refused as the status table says, each
// with a message that names what was wrong. It prints "ok" when every
// check passes.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "zctipc.h"
#include "check.h"

int main(int argc, char **argv) {
    CHECK(argc == 2);
    const char *name = argv[1];

    /* The inline record type has a name. */
    CHECK(ZCT_RECORD_INLINE == 4);

    int64_t shape[1] = {64};
    zct_handle seg = 0;
    zct_info info;
    CHECK(zct_segment_create(name, ZCT_FLOAT32, 1, shape, &seg, &info) == ZCT_OK);

    /* A NULL out-parameter is a bad argument, not a success. */
    CHECK(zct_segment_refcount(seg, NULL) == ZCT_E_INVALID);
    CHECK(strstr(zct_last_error(), "NULL") != NULL);
    int64_t count = 0;
    CHECK(zct_segment_refcount(seg, &count) == ZCT_OK && count == 1);

    zct_handle q = 0;
    CHECK(zct_queue_create(NULL, 4096, 0, &q) == ZCT_OK);
    int64_t items = -1, unfinished = -1;
    CHECK(zct_queue_len(q, NULL, &unfinished) == ZCT_E_INVALID);
    CHECK(zct_queue_len(q, &items, NULL) == ZCT_E_INVALID);
    CHECK(zct_queue_len(q, NULL, NULL) == ZCT_E_INVALID);
    CHECK(zct_queue_len(q, &items, &unfinished) == ZCT_OK && items == 0 && unfinished == 0);

    /* Bad counts are reported as bad counts, not as NULL pointers. */
    char buf[256];
    int32_t records = 0, nviews = 0;
    uint64_t filled = 0;
    zct_record recs[1];
    CHECK(zct_queue_get_many(q, buf, sizeof buf, 0, 0, &records, recs, &filled, NULL, 0, &nviews) ==
          ZCT_E_INVALID);
    CHECK(strstr(zct_last_error(), "NULL") == NULL);
    CHECK(strstr(zct_last_error(), "max_records") != NULL);
    CHECK(zct_queue_put(q, ZCT_RECORD_BYTES, "x", 1, NULL, -1, 0) == ZCT_E_INVALID);
    CHECK(strstr(zct_last_error(), "NULL") == NULL);
    CHECK(strstr(zct_last_error(), "nviews") != NULL);

    /* An extent smaller than the shape needs is refused, and no count is
       left taken. */
    int64_t ashape[1] = {64}, astrides[1] = {4};
    CHECK(zct_queue_put_array(q, ZCT_RECORD_TENSOR, info.data, 16, ZCT_FLOAT32, 1, ashape, astrides, 0, 0) ==
          ZCT_E_INVALID);
    CHECK(strstr(zct_last_error(), "extent") != NULL);
    CHECK(zct_queue_len(q, &items, &unfinished) == ZCT_OK && items == 0);
    CHECK(zct_segment_refcount(seg, &count) == ZCT_OK && count == 1);
    /* An unknown dtype is ZCT_E_DTYPE, a code past 16 bits among them
       (never wrapped onto a known one), and no count is left taken. */
    CHECK(zct_queue_put_array(q, ZCT_RECORD_TENSOR, info.data, 256, 999, 1, ashape, astrides, 0, 0) ==
          ZCT_E_DTYPE);
    CHECK(zct_queue_put_array(q, ZCT_RECORD_TENSOR, info.data, 256, 65536 + ZCT_FLOAT32, 1, ashape, astrides, 0, 0) ==
          ZCT_E_DTYPE);
    CHECK(zct_queue_put_array(q, ZCT_RECORD_TENSOR, info.data, 256, -1, 1, ashape, astrides, 0, 0) == ZCT_E_DTYPE);
    int64_t ishape[1] = {4};
    float ielems[4] = {0};
    CHECK(zct_queue_put_inline(q, ielems, sizeof ielems, 65536 + ZCT_FLOAT32, 1, ishape, 0, 0) == ZCT_E_DTYPE);
    zct_handle bad;
    zct_info binfo;
    CHECK(zct_segment_create(NULL, 65536 + ZCT_FLOAT32, 1, ishape, &bad, &binfo) == ZCT_E_DTYPE);
    CHECK(zct_queue_len(q, &items, &unfinished) == ZCT_OK && items == 0);
    CHECK(zct_segment_refcount(seg, &count) == ZCT_OK && count == 1);
    CHECK(zct_queue_put_array(q, ZCT_RECORD_TENSOR, info.data, 256, ZCT_FLOAT32, 1, ashape, astrides, 0, 0) ==
          ZCT_OK);
    CHECK(zct_queue_len(q, &items, &unfinished) == ZCT_OK && items == 1);

    CHECK(zct_queue_close(q) == ZCT_OK);
    CHECK(zct_segment_close(seg) == ZCT_OK);
    /* A normal exit gives up what the process still holds, as zctipc.h
       says a C program does: the ticket arena of the counts it sent. */
    CHECK(zct_release_all(NULL) == ZCT_OK);
    printf("ok\n");
    return 0;
}
